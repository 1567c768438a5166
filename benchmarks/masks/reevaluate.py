"""Stored runs of the mask benchmark scored again (``python -m benchmarks.masks --by-size``
and ``--reevaluate KEY=VALUE``).

- ``--by-size``: box and mask AP per object size (``benchmarks.masks.sizes``) of each stored
  run, from the detections its evaluation saved; nothing runs the model again.
- ``--reevaluate KEY=VALUE ...``: each stored run's weights evaluated again with inference
  keys changed (e.g. ``MODEL.SIPMASK.MASK_THRESHOLD=0.5``), so that an inference choice is
  decided on the same trained models; its detections go to
  ``OUTPUT/reevaluate/<KEY=VALUE...>/<contender>-<seed>/``.

Each writes one record per run (``run.kind`` "by_size" or "reevaluate"; the overrides the
run's, then the changed keys), which ``benchmarks.tables`` shows beside the trained runs.
"""
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

from benchmarks import records
from benchmarks.masks import sizes

BENCHMARK = "masks"


def parse_assignments(items: Sequence[str]) -> List:
    """["KEY=VALUE", ...] -> [KEY, VALUE, ...] for ``cfg.merge_from_list`` (values as
    written: yacs parses them); refuses an item without "=" or without a key."""
    flat = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--reevaluate: '{item}' is not KEY=VALUE "
                             "(e.g. MODEL.SIPMASK.MASK_THRESHOLD=0.5)")
        flat += [key, value]
    return flat


def stored_runs(output: Path, contenders: Sequence[str], seeds: Sequence[int]
                ) -> List[Tuple[str, int, Path]]:
    """(contender, seed, run folder) of each asked run whose final weights are stored."""
    found = []
    for name in contenders:
        for seed in seeds:
            folder = output / "runs" / f"{name}-{seed}"
            if (folder / "model_final.pth").is_file():
                found.append((name, seed, folder))
    return found


def size_record(name: str, seed: int, iters: int, scores: Dict[str, Dict[str, float]],
                command: str, overrides: Sequence, kind: str,
                metrics: Dict = None, regime: str = "quickstart") -> dict:
    """The record of one run scored by size (``kind`` "by_size"), or re-evaluated
    (``kind`` "reevaluate", with its box and mask ``metrics`` as the trained runs')."""
    return records.make_record(
        BENCHMARK, command=command, seed=seed, overrides=overrides,
        metrics={**(metrics or {}), "box_by_size": scores["box"],
                 "mask_by_size": scores.get("mask", {})},
        times={}, run={"kind": kind, "contender": name, "iters": iters,
                       "mask_regime": regime})


def by_size(output: Path, runs: List[Tuple[str, int, Path]], dataset: str, iters: int,
            command: str, opts: Sequence, regime: str = "quickstart") -> List[dict]:
    """A "by_size" record of each run in ``runs`` (of data `regime`), appended to the
    records file."""
    made = []
    for name, seed, folder in runs:
        record = size_record(name, seed, iters, sizes.run_by_size(folder, dataset), command,
                             opts, "by_size", regime=regime)
        records.append_record(record)
        made.append(record)
    return made


def reevaluate(output: Path, runs: List[Tuple[str, int, Path]], changed: List, iters: int,
               command: str, opts: Sequence, setup: Callable,
               regime: str = "quickstart") -> List[dict]:
    """Each run's final weights evaluated with ``changed`` keys after ``opts``
    (``setup(name, seed, output_dir, iters, opts)`` gives the config), a "reevaluate"
    record each, appended to the records file."""
    from detectron2.modeling import build_model

    from fcos_d2.checkpoint import FCOSCheckpointer
    from fcos_d2.engine.trainer import Trainer

    tag = ",".join(f"{k}={v}" for k, v in zip(changed[::2], changed[1::2]))
    made = []
    for name, seed, folder in runs:
        run_dir = output / "reevaluate" / tag / f"{name}-{seed}"
        cfg = setup(name, seed, str(run_dir), iters, [*opts, *changed])
        model = build_model(cfg).eval()
        FCOSCheckpointer(model).load(str(folder / "model_final.pth"))
        results = Trainer.test(cfg, model, iterations=iters)  # one dataset: not keyed by it
        metrics = {"box": dict(results["bbox"]), "mask": dict(results.get("segm", {}))}
        record = size_record(name, seed, iters,
                             sizes.run_by_size(run_dir, cfg.DATASETS.TEST[0]), command,
                             [*opts, *changed], "reevaluate", metrics, regime)
        records.append_record(record)
        made.append(record)
    return made
