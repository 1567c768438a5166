"""ExactResume: the RNG states, the data stream and the EMA loss normalizers travel with the
checkpoint, in a form that loads with torch.load(weights_only=True)."""
import io
import random
from types import SimpleNamespace

import numpy as np
import torch

from fcos_d2.engine.resumable_loader import ResumableTrainLoader
from fcos_d2.engine.resume import ExactResume, get_rng_states, set_rng_states
from fcos_d2.modeling.losses import EMANormalizer


def weights_only_round_trip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def draws():
    return random.random(), random.gauss(0, 1), float(np.random.randn()), torch.rand(2).tolist()


def test_rng_states_survive_a_weights_only_checkpoint():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1), np.random.randn()  # both keep a cached gaussian now
    states = weights_only_round_trip(get_rng_states())
    expected = draws()
    set_rng_states(states)
    assert draws() == expected


def trainer_at(iteration: int):
    """A trainer's parts the hook reads: a model whose head has an EMA loss normalizer."""
    loader = ResumableTrainLoader([{"width": 4, "height": 4}] * 3, mapper=dict,
                                  total_batch_size=1, seed=5)
    model = torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.Module())
    model[1].loss_normalizer = EMANormalizer(initial=300.0, momentum=0.99)
    return SimpleNamespace(iter=iteration, start_iter=iteration, max_iter=10,
                           data_loader=loader, model=model)


def test_after_a_checkpoint_the_next_iteration_draws_the_same_numbers_resumed_or_not():
    hook = ExactResume(checkpoint_period=2)
    hook.trainer = trainer_at(1)
    batches = iter(hook.trainer.data_loader)
    next(batches), next(batches)
    normalizer = hook.trainer.model[1].loss_normalizer
    normalizer(40.0, 20.0), normalizer(60.0, 25.0)
    hook.after_step()  # iteration 1 ends: the checkpointer saves now
    checkpoint = weights_only_round_trip(hook.state_dict())
    draws()  # the evaluation after the checkpoint draws random numbers
    hook.trainer.iter = 2
    hook.before_step()
    uninterrupted = draws()

    resumed = ExactResume(checkpoint_period=2)
    resumed.trainer = trainer_at(1)
    resumed.load_state_dict(checkpoint)
    torch.manual_seed(123)  # setup code between loading and training draws too
    resumed.trainer.iter = 2
    resumed.before_step()
    assert draws() == uninterrupted
    assert resumed.trainer.data_loader.position == 2
    assert resumed.trainer.model[1].loss_normalizer.values == normalizer.values


def test_resuming_from_a_checkpoint_without_the_states_warns_that_it_is_not_exact(caplog):
    hook = ExactResume(checkpoint_period=2)
    hook.trainer = trainer_at(4)  # resumed: start_iter 4, and nothing was loaded
    hook.before_train()
    assert "the data stream starts again" in caplog.text
