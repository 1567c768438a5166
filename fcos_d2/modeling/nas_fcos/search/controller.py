"""The search's sampler and its LSTM controller trained with PPO (re-implemented from the
NAS-FCOS paper; the sizes follow the nas-segm code it builds on: 2 LSTM layers of 100
units, PPO clip 0.1, a moving-average reward baseline).

A genotype is a sequence of decisions, each a choice among ``choices[k]`` options of
which the first ``limits[k]`` are allowed (a cell may read only the pool built so far):

- FPN: per cell, input index, input index, operation, operation, aggregation;
- head: the share index, then one operation per layer.

Symbols: D decisions, H hidden units.
"""
from typing import List, Sequence, Tuple

import torch
from torch import Tensor, nn

from ..genotypes import (FPN_AGGREGATIONS, FPN_OPS, HEAD_OPS, NUM_INPUTS, FPNCell, FPNGenotype,
                         GenotypeError, HeadGenotype, validate_fpn_genotype)


def fpn_decisions(num_cells: int) -> Tuple[List[int], List[int]]:
    """(choices, limits) of an FPN genotype of ``num_cells`` cells."""
    choices, limits = [], []
    pool_max = NUM_INPUTS + num_cells - 1
    for cell in range(num_cells):
        choices += [pool_max, pool_max, len(FPN_OPS), len(FPN_OPS), len(FPN_AGGREGATIONS)]
        limits += [NUM_INPUTS + cell] * 2 + [len(FPN_OPS)] * 2 + [len(FPN_AGGREGATIONS)]
    return choices, limits


def head_decisions(num_layers: int) -> Tuple[List[int], List[int]]:
    """(choices, limits) of a head genotype of ``num_layers`` layers."""
    choices = [num_layers + 1] + [len(HEAD_OPS)] * num_layers
    return choices, list(choices)


def fpn_from_actions(actions: Sequence[int]) -> FPNGenotype:
    """The FPN genotype of a decision sequence (GenotypeError if it breaks the rule)."""
    cells = [FPNCell((a, b), (FPN_OPS[o0], FPN_OPS[o1]), FPN_AGGREGATIONS[g])
             for a, b, o0, o1, g in zip(*[iter(actions)] * 5)]
    return validate_fpn_genotype(FPNGenotype(tuple(cells)))


def head_from_actions(actions: Sequence[int]) -> HeadGenotype:
    return HeadGenotype(tuple(HEAD_OPS[a] for a in actions[1:]), int(actions[0]))


class Controller(nn.Module):
    """An LSTM that emits one decision per step, fed the embedding of the previous one."""

    def __init__(self, choices: Sequence[int], limits: Sequence[int], hidden: int = 100,
                 layers: int = 2):
        super().__init__()
        self.choices, self.limits = list(choices), list(limits)
        self.start = nn.Parameter(torch.zeros(1, 1, hidden))
        self.embed = nn.Embedding(max(choices), hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=layers)
        self.heads = nn.ModuleList([nn.Linear(hidden, c) for c in choices])

    def _logits(self, step: int, output: Tensor) -> Tensor:
        logits = self.heads[step](output.view(-1))  # (choices[step],)
        allowed = torch.arange(len(logits)) < self.limits[step]
        return logits.masked_fill(~allowed, float("-inf"))

    def run(self, actions: Sequence[int] = (), generator=None) -> Tuple[List[int], Tensor]:
        """Samples a decision sequence (or scores the given ``actions``): (actions, the sum
        of their log-probabilities)."""
        x, state, taken, log_prob = self.start, None, [], torch.zeros(())
        for step in range(len(self.choices)):
            output, state = self.lstm(x, state)  # (1, 1, H)
            dist = torch.distributions.Categorical(logits=self._logits(step, output))
            if actions:
                action = int(actions[step])
            else:
                action = int(torch.multinomial(dist.probs, 1, generator=generator))
            log_prob = log_prob + dist.log_prob(torch.tensor(action))
            taken.append(action)
            x = self.embed(torch.tensor([[action]]))  # (1, 1, H)
        return taken, log_prob


def sample_valid(controller: Controller, decode, generator=None, max_tries: int = 1000):
    """(actions, genotype, log-probability) of the first sample that decodes to a valid
    genotype: the search only ever trains valid ones."""
    for _ in range(max_tries):
        with torch.no_grad():
            actions, log_prob = controller.run(generator=generator)
        try:
            return actions, decode(actions), float(log_prob)
        except GenotypeError:
            continue
    raise RuntimeError(f"no valid genotype in {max_tries} samples of the controller")


class PPO:
    """PPO on the controller with a moving-average baseline of the rewards."""

    def __init__(self, controller: Controller, lr: float = 1e-3, clip: float = 0.1,
                 baseline_decay: float = 0.95, epochs: int = 2):
        self.controller, self.clip, self.epochs = controller, clip, epochs
        self.decay = baseline_decay
        self.optimizer = torch.optim.Adam(controller.parameters(), lr=lr)
        self.baseline = None

    def update(self, actions: List[int], old_log_prob: float, reward: float) -> float:
        """One PPO step on one sampled genotype; returns its advantage."""
        self.baseline = reward if self.baseline is None else \
            self.decay * self.baseline + (1 - self.decay) * reward
        advantage = reward - self.baseline
        for _ in range(self.epochs):
            _, log_prob = self.controller.run(actions)
            ratio = torch.exp(log_prob - old_log_prob)
            loss = -torch.min(ratio * advantage,
                              ratio.clamp(1 - self.clip, 1 + self.clip) * advantage)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        return advantage

    def state_dict(self):
        return {"controller": self.controller.state_dict(),
                "optimizer": self.optimizer.state_dict(), "baseline": self.baseline}

    def load_state_dict(self, state) -> None:
        self.controller.load_state_dict(state["controller"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.baseline = state["baseline"]


def sample_uniform(limits: Sequence[int], decode, generator=None, max_tries: int = 1000):
    """(actions, genotype) drawn uniformly among the allowed choices of every decision,
    redrawn until valid: the random-search baseline and the sampler of valid genotypes."""
    for _ in range(max_tries):
        actions = [int(torch.randint(limit, (1,), generator=generator)) for limit in limits]
        try:
            return actions, decode(actions)
        except GenotypeError:
            continue
    raise RuntimeError(f"no valid genotype in {max_tries} uniform samples")
