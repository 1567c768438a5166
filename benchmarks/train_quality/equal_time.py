"""The training-quality records at equal iterations and at equal training time, for the
docs' table (``benchmarks.tables``), from the records alone.

A comparison holds the records of one regime, one CPU kind (model and bf16/AMX flags) and
one set of overrides other than the schedule's (``SCHEDULE_KEYS``; ``MODEL.DEVICE`` stays, so GPU runs form their own),
each a run that ended "ok" and counted its iterations. In it:

- the reference schedule is the iteration count most contenders ran (ties: the fewest);
- equal iterations: each contender's mean AP over its runs at that count, its mean
  seconds per iteration and its mean training seconds;
- equal training time: the budget is the fastest contender's mean training seconds at the
  reference count; a contender's iterations in the budget are the budget over its seconds
  per iteration (at the reference count where it ran it), rounded down; its AP at equal time
  is the mean AP of its runs of the most iterations within that count, a measured point,
  never interpolated, and only if those runs did at least half of that count (none: a run
  of it is needed, and the row says of how many iterations);
- every other iteration count the shipped recipe ran (``ANCHOR``, e.g. its own 48 epochs)
  gets a comparison of its own: that count is its reference and the recipe's training time
  there its budget, so that the other contenders are seen at the recipe's full cost.

Shapes: a record is (line in the records file, record dict); a row is a list of cells.
"""
import math
import statistics
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from benchmarks.records import overrides_key, score
from benchmarks.train_quality.contenders import RECIPE as ANCHOR

SCHEDULE_KEYS = ("SOLVER.MAX_ITER", "SOLVER.STEPS", "SOLVER.WARMUP_ITERS")
HEADER = ["contender", "seeds (reference / its run)", "AP at the reference iterations",
          "s / iteration", "training s", "iterations in the budget", "AP at equal time",
          "its run", "records"]
Numbered = List[Tuple[int, dict]]


@dataclass
class Point:
    """A contender's runs of one iteration count in a comparison: their means."""

    iterations: int
    ap: float
    seconds: float
    seconds_per_iteration: float
    seeds: List[int]
    lines: List[int]


@dataclass
class Comparison:
    """One regime, CPU kind and non-schedule overrides: its title line and rows."""

    title: str
    rows: List[List[str]]


def other_than_schedule(overrides: Sequence[str]) -> Tuple[str, ...]:
    """`overrides` (KEY VALUE ...) without the pairs of ``SCHEDULE_KEYS``."""
    pairs = [tuple(overrides[i:i + 2]) for i in range(0, len(overrides), 2)]
    return tuple(item for pair in pairs if pair[0] not in SCHEDULE_KEYS for item in pair)


def cpu_kind(record: dict) -> str:
    """The record's CPU model with its bf16 and AMX flags: one model name covers machines
    with and without AMX, whose seconds per iteration differ."""
    cpu = record["cpu"]
    return cpu["model"] + (f" ({', '.join(cpu['flags'])})" if cpu.get("flags") else "")


def _timed(numbered: Numbered) -> Numbered:
    return [(n, r) for n, r in numbered if r["run"].get("status", "ok") == "ok"
            and r["run"].get("iterations") and "train_seconds" in r["times"]]


def _point(iterations: int, group: Numbered) -> Point:
    """The means of `group`, the runs of one contender that did `iterations`."""
    seconds = [r["times"]["train_seconds"] for _, r in group]
    return Point(iterations, statistics.mean(score(r["metrics"]["AP"]) for _, r in group),
                 statistics.mean(seconds), statistics.mean(s / iterations for s in seconds),
                 [r["seed"] for _, r in group], [line for line, _ in group])


def points(numbered: Numbered) -> Dict[str, Dict[int, Point]]:
    """contender -> iterations -> the ``Point`` of its runs, in the records' order."""
    runs: Dict[str, Dict[int, Numbered]] = OrderedDict()
    for line, record in numbered:
        by_count = runs.setdefault(record["run"]["contender"], OrderedDict())
        by_count.setdefault(record["run"]["iterations"], []).append((line, record))
    return OrderedDict((name, OrderedDict((count, _point(count, group))
                                          for count, group in by_count.items()))
                       for name, by_count in runs.items())


def reference_iterations(curves: Dict[str, Dict[int, Point]]) -> int:
    """The iteration count most contenders ran (ties: the fewest iterations)."""
    counts = [count for curve in curves.values() for count in curve]
    return min(set(counts), key=lambda count: (-counts.count(count), count))


def at_most(curve: Dict[int, Point], iterations: int) -> Optional[Point]:
    """The point of `curve` of the most iterations not above `iterations`; None if none."""
    within = [count for count in curve if count <= iterations]
    return curve[max(within)] if within else None


def contender_row(name: str, curve: Dict[int, Point], reference: int,
                  budget: float) -> List[str]:
    """The cells of `name` (``HEADER``) against `reference` iterations and `budget` s."""
    at_reference = curve.get(reference)
    per_iteration = (at_reference.seconds_per_iteration if at_reference else
                     statistics.mean(p.seconds_per_iteration for p in curve.values()))
    in_budget = math.floor(budget / per_iteration + 1e-9)
    chosen = at_most(curve, in_budget)
    if chosen is not None and 2 * chosen.iterations < in_budget:  # cannot stand for it
        missing = (f"none: its run of {chosen.iterations} it. is under half of them; needs "
                   f"one of {math.ceil(in_budget / 2)}-{in_budget} iterations")
        chosen = None
    else:
        missing = f"none: needs a run of at most {in_budget} iterations"
    shown = [at_reference] if at_reference else []
    shown += [chosen] if chosen is not None and chosen is not at_reference else []
    # the records its seconds per iteration and its AP come from
    sources = shown if at_reference else list(curve.values())
    return [name, " / ".join(", ".join(str(s) for s in p.seeds) for p in shown),
            f"{at_reference.ap:.1f}" if at_reference else "",
            f"{per_iteration:.3f}", f"{at_reference.seconds:.0f}" if at_reference else "",
            str(in_budget), f"{chosen.ap:.1f}" if chosen else "",
            f"{chosen.iterations} it., {chosen.seconds:.0f} s" if chosen else missing,
            ", ".join(str(n) for p in sources for n in p.lines)]


def _compared(curves: Dict[str, Dict[int, Point]], reference: int, budget: float,
              heading: str) -> Comparison:
    return Comparison(heading, [contender_row(name, curve, reference, budget)
                                for name, curve in curves.items()])


def comparison(numbered: Numbered, title: str) -> List[Comparison]:
    """The ``Comparison`` of one group's records at the count most contenders ran, then one
    per other count of ``ANCHOR`` (budget: its training time there); [] if none counted
    its iterations."""
    curves = points(_timed(numbered))
    if not curves:
        return []
    reference = reference_iterations(curves)
    fastest = min((name for name in curves if reference in curves[name]),
                  key=lambda name: curves[name][reference].seconds)
    budget = curves[fastest][reference].seconds
    found = [_compared(curves, reference, budget,
                       f"{title}; reference {reference} iterations; budget {budget:.0f} s, "
                       f"the training time of the fastest contender there ({fastest})")]
    for count, point in curves.get(ANCHOR, {}).items():
        if count != reference:
            found.append(_compared(
                curves, count, point.seconds,
                f"{title}; reference {count} iterations, another schedule of {ANCHOR}; "
                f"budget {point.seconds:.0f} s, its training time there"))
    return found


def comparisons(numbered: Numbered) -> List[Comparison]:
    """The ``Comparison``s of each (regime, CPU kind, overrides other than the schedule's)."""
    groups: Dict[tuple, Numbered] = OrderedDict()
    for line, record in numbered:
        key = (record["run"].get("regime", "shapes"), cpu_kind(record),
               other_than_schedule(overrides_key(record)))  # with the recipe's digest
        groups.setdefault(key, []).append((line, record))
    return [found for (regime, cpu, overrides), group in groups.items()
            for found in comparison(group, f"Regime {regime}, {cpu}, overrides besides the "
                                           f"schedule's: {' '.join(overrides) or 'none'}")]
