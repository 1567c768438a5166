"""A training data loader whose stream can be saved in a checkpoint and resumed exactly.

detectron2's training loader restarts its stream of images when a training is resumed:
the same shuffle from the first image, new random augmentations, and the images that were
waiting in the aspect-ratio buckets lost. ``ResumableTrainLoader`` yields the same batches
as an uninterrupted run after ``load_state_dict`` because:

* the stream of dataset indices is detectron2's (``TrainingSampler`` or
  ``RepeatFactorTrainingSampler``, sharded by worker rank), and it restarts at the saved
  position by skipping what was already taken (indices are cheap to draw again);
* each element's random augmentation depends only on (seed, its place in the stream):
  the mapper runs with the global ``random``, ``numpy`` and ``torch`` generators seeded
  from those two numbers, and the generators of the caller are put back afterwards. So
  the batches are the same with any ``num_workers``, and no data-loader worker's RNG
  state needs saving;
* the elements waiting in the aspect-ratio buckets are saved by position and mapped
  again on resume.

Symbols: W = number of training workers (ranks), r = this rank, p = the position of an
element in this rank's stream (0, 1, ...), s = p * W + r its place in the job's stream.
"""
import itertools
import logging
import random
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
import torch.utils.data as torchdata
from detectron2.config import configurable
from detectron2.data import DatasetMapper, get_detection_dataset_dicts
from detectron2.data.samplers import RepeatFactorTrainingSampler, TrainingSampler
from detectron2.utils import comm

__all__ = ["ResumableTrainLoader", "build_resumable_train_loader"]

logger = logging.getLogger(__name__)

SUPPORTED_SAMPLERS = ("TrainingSampler", "RepeatFactorTrainingSampler")


class ResumableTrainLoader:
    """An endless iterable of batches (lists of mapped dicts), like detectron2's training
    loader, with ``state_dict()`` / ``load_state_dict()``.

    The state holds ints only (it loads with ``torch.load(weights_only=True)``): the
    shuffle seed, the number of workers W, the next position p and the positions waiting
    in the aspect-ratio buckets. Take it between batches, in every rank.
    """

    @configurable
    def __init__(self, dataset: List[dict], *, mapper: Callable[[dict], Optional[dict]],
                 total_batch_size: int, aspect_ratio_grouping: bool = True,
                 num_workers: int = 0, seed: Optional[int] = None,
                 repeat_factors: Optional[torch.Tensor] = None):
        """
        Args:
            dataset: dataset dicts (with "width" and "height" if grouping by aspect ratio).
            mapper: dataset dict -> model input dict, or None to skip the element.
            total_batch_size: images per iteration over all W workers.
            aspect_ratio_grouping: batch images with w > h apart from the others.
            num_workers: data-loading processes per worker; 0 loads in this process.
            seed: shuffle and augmentation seed, the same in every worker; None draws one
                shared by the workers.
            repeat_factors: (len(dataset),) per-image repeat factors
                (``RepeatFactorTrainingSampler``); None samples every image once an epoch.
        """
        world_size = comm.get_world_size()
        if total_batch_size <= 0 or total_batch_size % world_size:
            raise ValueError(f"SOLVER.IMS_PER_BATCH {total_batch_size} must be a positive "
                             f"multiple of the number of workers ({world_size})")
        self.dataset, self.mapper = dataset, mapper
        self.batch_size = total_batch_size // world_size
        self.aspect_ratio_grouping, self.num_workers = aspect_ratio_grouping, num_workers
        self.repeat_factors = repeat_factors
        self.world_size, self.rank = world_size, comm.get_rank()
        self._set_seed(int(seed) if seed is not None else comm.shared_random_seed())
        self.position = 0  # p of the next element this rank takes from its stream
        self.buckets: List[List[Tuple[int, dict]]] = [[], []]  # (p, mapped dict) waiting

    @classmethod
    def from_config(cls, cfg, mapper: Optional[Callable] = None) -> Dict[str, Any]:
        sampler = cfg.DATALOADER.SAMPLER_TRAIN
        if sampler not in SUPPORTED_SAMPLERS:
            raise ValueError(f"DATALOADER.SAMPLER_TRAIN {sampler!r} is not supported by "
                             f"fcos-d2's resumable training loader; use one of "
                             f"{SUPPORTED_SAMPLERS}")
        dataset = get_detection_dataset_dicts(
            cfg.DATASETS.TRAIN, filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS)
        repeat_factors = None
        if sampler == "RepeatFactorTrainingSampler":
            repeat_factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(
                dataset, cfg.DATALOADER.REPEAT_THRESHOLD)
        return {
            "dataset": dataset,
            "mapper": mapper if mapper is not None else DatasetMapper(cfg, True),
            "total_batch_size": cfg.SOLVER.IMS_PER_BATCH,
            "aspect_ratio_grouping": cfg.DATALOADER.ASPECT_RATIO_GROUPING,
            "num_workers": cfg.DATALOADER.NUM_WORKERS,
            "seed": cfg.SEED if cfg.SEED >= 0 else None,
            "repeat_factors": repeat_factors,
        }

    def state_dict(self) -> Dict[str, Any]:
        return {"seed": self.seed, "world_size": self.world_size, "position": self.position,
                "pending": [[p for p, _ in bucket] for bucket in self.buckets]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues the stream that ``state`` was taken from. Call before iterating."""
        if state["world_size"] != self.world_size:
            raise ValueError(f"the data stream was saved by {state['world_size']} workers; "
                             f"this job has {self.world_size}")
        self._set_seed(int(state["seed"]))
        self.position = int(state["position"])
        self.buckets = [[(p, self.map(p, index)) for p, index in self._indices(positions)]
                        for positions in state["pending"]]

    def __iter__(self) -> Iterator[List[dict]]:
        # A generator: nothing runs (and no data-loader process starts) before the first
        # next(), so an iterator taken before load_state_dict still resumes.
        for position, element in self._mapped_stream(self.position):
            self.position = position + 1
            if element is None:
                continue
            grouped = self.aspect_ratio_grouping and element["width"] > element["height"]
            bucket = self.buckets[0 if grouped else 1]
            bucket.append((position, element))
            if len(bucket) == self.batch_size:
                batch = [d for _, d in bucket]
                bucket.clear()
                yield batch

    def map(self, position: int, index: int) -> Optional[dict]:
        """Maps dataset[index], at ``position`` in this rank's stream, with the global RNGs
        seeded from (seed, s); the caller's RNG states are restored afterwards."""
        saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        words = np.random.SeedSequence([self.seed, position * self.world_size + self.rank])
        seeds = [int(word) for word in words.generate_state(3, dtype=np.uint32)]
        random.seed(seeds[0])
        np.random.seed(seeds[1])
        torch.default_generator.manual_seed(seeds[2])  # not torch.manual_seed: CPU only
        try:
            return self.mapper(self.dataset[index])
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])

    def _set_seed(self, seed: int) -> None:
        # The samplers read the rank and W here; each iter() restarts their stream.
        self.seed = seed
        if self.repeat_factors is not None:
            self.sampler = RepeatFactorTrainingSampler(self.repeat_factors, seed=seed)
        else:
            self.sampler = TrainingSampler(len(self.dataset), seed=seed)

    def _indices(self, positions: List[int]) -> List[Tuple[int, int]]:
        """(p, dataset index) of the given positions of this rank's stream."""
        wanted, found = set(positions), {}
        for position, index in enumerate(self.sampler):
            if len(found) == len(wanted):
                break
            if position in wanted:
                found[position] = index
        return [(p, found[p]) for p in positions]

    def _mapped_stream(self, start: int) -> Iterator[Tuple[int, Optional[dict]]]:
        """(p, mapped element or None) for p = start, start + 1, ..., in order."""
        stream = _MappedStream(self, start)
        if self.num_workers == 0:
            return iter(stream)
        # batch_size None: the workers yield elements one at a time, in turn, so they
        # arrive in stream order.
        return iter(torchdata.DataLoader(stream, batch_size=None, num_workers=self.num_workers,
                                         collate_fn=_unchanged))


class _MappedStream(torchdata.IterableDataset):
    """This rank's stream from position ``start``; data-loader worker k of K maps the
    positions start + k, start + k + K, ..."""

    def __init__(self, loader: ResumableTrainLoader, start: int):
        self.loader, self.start = loader, start

    def __iter__(self) -> Iterator[Tuple[int, Optional[dict]]]:
        info = torchdata.get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        indices = itertools.islice(self.loader.sampler, self.start + worker, None, num_workers)
        for step, index in enumerate(indices):
            position = self.start + worker + step * num_workers
            yield position, self.loader.map(position, index)


def _unchanged(element):
    return element


def build_resumable_train_loader(cfg, mapper: Optional[Callable] = None) -> ResumableTrainLoader:
    """``build_detection_train_loader(cfg, mapper)`` with a stream that resumes exactly."""
    return ResumableTrainLoader(cfg, mapper=mapper)
