"""ResumableTrainLoader: a loader restored from its state yields what an uninterrupted one
yields next, with random augmentations and aspect-ratio buckets, with or without
data-loader processes."""
import io
import itertools
import random

import numpy as np
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.data.samplers import RepeatFactorTrainingSampler, TrainingSampler

from fcos_d2.engine.resumable_loader import ResumableTrainLoader, build_resumable_train_loader

# 7 images: ids 0..6, the odd ones wider than tall (they go to their own bucket).
DATASET = [{"image_id": i, "width": 80 if i % 2 else 60, "height": 60} for i in range(7)]


def random_mapper(d):
    """The dataset dict plus one draw from each global generator, as an augmentation."""
    return {**d, "draws": (random.random(), float(np.random.rand()), torch.rand(()).item())}


def loader(num_workers=0, grouping=True, repeat_factors=None):
    return ResumableTrainLoader(DATASET, mapper=random_mapper, total_batch_size=3,
                                aspect_ratio_grouping=grouping, num_workers=num_workers, seed=11,
                                repeat_factors=repeat_factors)


def batches(source, count):
    iterator = iter(source)
    return [next(iterator) for _ in range(count)]


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_loader_given_a_saved_state_continues_exactly_where_the_saved_one_was(num_workers):
    whole = batches(loader(num_workers), 9)

    first = loader(num_workers)
    iterator = iter(first)
    head = [next(iterator) for _ in range(4)]
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert any(state["pending"]), "a bucket holds images at the cut: they must come back"

    second = loader(num_workers)
    iterator = iter(second)  # taken before the state is loaded, as SimpleTrainer does
    second.load_state_dict(state)
    assert head + [next(iterator) for _ in range(5)] == whole


def test_the_batches_do_not_depend_on_the_number_of_data_loader_processes():
    assert batches(loader(num_workers=0), 6) == batches(loader(num_workers=2), 6)


def test_without_grouping_the_images_come_in_detectron2s_training_sampler_order():
    ids = [d["image_id"] for batch in batches(loader(grouping=False), 5) for d in batch]
    assert ids == list(itertools.islice(TrainingSampler(len(DATASET), seed=11), 15))


def test_with_repeat_factors_the_images_come_in_repeat_factor_sampler_order():
    factors = torch.tensor([1.0, 3.0, 1.0, 1.0, 2.0, 1.0, 1.0])
    source = loader(grouping=False, repeat_factors=factors)
    ids = [d["image_id"] for batch in batches(source, 5) for d in batch]
    assert ids == list(itertools.islice(RepeatFactorTrainingSampler(factors, seed=11), 15))


def test_a_sampler_it_cannot_resume_is_refused_naming_the_key():
    cfg = get_cfg()
    cfg.DATALOADER.SAMPLER_TRAIN = "RandomSubsetTrainingSampler"
    with pytest.raises(ValueError, match="DATALOADER.SAMPLER_TRAIN 'RandomSubsetTrainingSampler' "
                                         "is not supported"):
        build_resumable_train_loader(cfg)


def test_augmentations_differ_between_images_and_leave_the_callers_generators_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    draws = [d["draws"] for batch in batches(loader(), 4) for d in batch]
    assert torch.equal(torch.rand(3), expected)
    assert len(set(draws)) == len(draws)


def test_a_state_saved_by_another_number_of_workers_is_refused():
    state = {**loader().state_dict(), "world_size": 2}
    with pytest.raises(ValueError, match="saved by 2 workers; this job has 1"):
        loader().load_state_dict(state)
