"""The command of the mask benchmark (``python -m benchmarks.masks``; what it measures is
described in ``benchmarks/masks/__init__.py``): one (contender, seed) run in a child process,
the latency of the seed-0 models side by side, and the table."""
import argparse
import json
import math
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import benchmarks.masks as package
from benchmarks import records
from benchmarks.masks import reevaluate as stored, sizes
from benchmarks.masks.configs import (CONTENDERS, REGIMES, REPO, SIPMASK_CONFIG,
                                      base_config_file, base_max_iter, regime_of, run_key,
                                      setup_cfg, val_dataset)
from benchmarks.runner import (add_child_arguments, append_results, iteration_progress,
                               load_results, loss_recorder, module_command, run_all)

MODULE = "benchmarks.masks"
BENCHMARK = "masks"  # benchmarks/results/masks.jsonl
METRICS = ("AP", "AP50", "AP75")


def run_one(name: str, seed: int, output_dir: str, iters: int, opts: List,
            val_images: Optional[int] = None, regime: str = "quickstart") -> dict:
    """Trains contender ``name`` with ``seed`` on the data `regime` through the library
    trainer; returns its box and mask metrics, final losses and training time."""
    import torch
    from detectron2.utils.env import seed_all_rng

    from fcos_d2.engine.trainer import Trainer

    torch.set_num_threads(1)
    base_config = base_config_file().name
    commit = records.git_state()[0][:7]
    cfg = setup_cfg(name, seed, output_dir, iters, opts, val_images, regime)
    seed_all_rng(seed)
    trainer = Trainer(cfg)
    recorder = loss_recorder()
    trainer.register_hooks([recorder, iteration_progress()])
    trainer.resume_or_load(resume=False)
    start = time.perf_counter()
    status = "ok"
    try:
        trainer.train()  # returns the evaluation only with TEST.EXPECTED_RESULTS set
    except FloatingPointError as error:  # a non-finite loss (StopOnNonFiniteLoss)
        status = f"diverged: {error}"
    seconds = time.perf_counter() - start
    latest = trainer.storage.latest()  # the final evaluation put "bbox/AP", "segm/AP", ...
    scores = {task: {m: latest[f"{task}/{m}"][0] if f"{task}/{m}" in latest else math.nan
                     for m in METRICS} for task in ("bbox", "segm")}
    by_size = (sizes.run_by_size(Path(output_dir), cfg.DATASETS.TEST[0]) if status == "ok"
               else {})
    return {"contender": name, "seed": seed, "status": status, "box": scores["bbox"],
            "mask": scores["segm"], "box_by_size": by_size.get("box", {}),
            "mask_by_size": by_size.get("mask", {}),
            "final_losses": {k: v for k, v in recorder.tail().items() if k.startswith("loss")},
            "train_and_eval_seconds": round(seconds, 1), "iters": iters,
            "base_config": base_config, "mask_regime": regime, "commit": commit,
            **run_key(cfg)}


# ---------------------------------------------------------------- latency (one process)

def measure_latency(names: List[str], output: Path, iters: int, opts: List,
                    num_images: int, val_images: Optional[int] = None,
                    warmup: int = 5, regime: str = "quickstart") -> Dict[str, dict]:
    """Median inference seconds per image of each contender's seed-0 model, timed side by
    side: one thread, batch 1, the contenders alternating image by image.

    Returns:
        name -> {"median_s", "images"}; contenders without a seed-0 model are left out,
        and nothing is timed (no model is built) when ``num_images`` is 0.
    """
    if num_images < 1:
        return {}
    import torch
    from detectron2.modeling import build_model

    from fcos_d2.checkpoint import FCOSCheckpointer
    from fcos_d2.engine.trainer import Trainer

    torch.set_num_threads(1)
    models = {}
    for name in names:
        weights = output / "runs" / f"{name}-0" / "model_final.pth"
        if weights.is_file():
            cfg = setup_cfg(name, 0, str(output / "runs" / f"{name}-0"), iters, opts,
                            val_images, regime)
            models[name] = build_model(cfg).eval()
            FCOSCheckpointer(models[name]).load(str(weights))
    if not models:
        return {}
    loader = Trainer.build_test_loader(cfg, cfg.DATASETS.TEST[0])  # the same for all
    inputs = [batch for batch, _ in zip(loader, range(num_images + warmup))]
    times: Dict[str, List[float]] = {name: [] for name in models}
    with torch.no_grad():
        for index, batch in enumerate(inputs):
            for name, model in models.items():
                start = time.perf_counter()
                model(batch)
                if index >= warmup:
                    times[name].append(time.perf_counter() - start)
    return {name: {"median_s": statistics.median(t), "images": len(t)}
            for name, t in times.items()}


# ---------------------------------------------------------------- table

def summarise(results: List[dict], latency: Dict[str, dict], names: List[str]) -> str:
    """A markdown table: per contender, mask AP mean / sample std / range over seeds, mask
    AP50 and AP75 means, box AP mean and std, and the median latency per image."""
    rows = ["| contender | seeds | mask AP mean | mask AP std | mask AP min-max | mask AP50 | "
            "mask AP75 | box AP mean | box AP std | ms / image |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        runs = sorted((r for r in results if r["contender"] == name), key=lambda r: r["seed"])
        if not runs:
            continue
        mask, box = [r["mask"]["AP"] for r in runs], [r["box"]["AP"] for r in runs]
        notes = "; ".join(f"seed {r['seed']} {r['status']}" for r in runs if r["status"] != "ok")
        ms = latency.get(name, {}).get("median_s")
        rows.append(
            f"| {name}{' (' + notes + ')' if notes else ''} | "
            f"{','.join(str(r['seed']) for r in runs)} | {statistics.mean(mask):.1f} | "
            f"{_std(mask):.1f} | {min(mask):.1f}-{max(mask):.1f} | "
            f"{statistics.mean(r['mask']['AP50'] for r in runs):.1f} | "
            f"{statistics.mean(r['mask']['AP75'] for r in runs):.1f} | "
            f"{statistics.mean(box):.1f} | {_std(box):.1f} | "
            f"{'n/a' if ms is None else f'{1000 * ms:.1f}'} |")
    return "\n".join(rows)


def _std(values: List[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else float("nan")


def repository_record(result: dict, command: str, opts: List) -> dict:
    """The ``benchmarks.records`` record of one run's `result` (a results.jsonl line)."""
    measured = ("box", "mask", "box_by_size", "mask_by_size")
    kept = {k: v for k, v in result.items()
            if k not in (*measured, "train_and_eval_seconds", "regime", "seed")}
    return records.make_record(
        BENCHMARK, command=command, seed=result["seed"], overrides=opts,
        metrics={k: result[k] for k in measured if k in result},
        times={"train_and_eval_seconds": result["train_and_eval_seconds"]}, run=kept)


def latency_record(latency: Dict[str, dict], command: str, opts: List, iters: int,
                   regime: str = "quickstart") -> dict:
    """The ``benchmarks.records`` record of the latency of the seed-0 models."""
    return records.make_record(
        BENCHMARK, command=command, seed=0, overrides=opts,
        metrics={name: {"ms_per_image": 1000 * v["median_s"]} for name, v in latency.items()},
        times={}, run={"kind": "latency", "iters": iters, "mask_regime": regime,
                       "images": {name: v.get("images") for name, v in latency.items()}})


def run_child(args, output: Path, command: str) -> None:
    """One (contender, seed) run: its result goes to ``output/results.jsonl`` and its record
    to the repository's records file."""
    import fcos_d2  # noqa: F401  (before detectron2)

    result = run_one(args.run, args.seed, str(output / "runs" / f"{args.run}-{args.seed}"),
                     args.iters, args.opts, args.val_images, args.regime)
    append_results(output / "results.jsonl", [result])
    records.append_record(repository_record(result, command, args.opts))


def main(argv: Optional[List[str]] = None) -> str:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    data = regime_of(args.regime)
    output = Path(args.output or REPO / "output" / data.output)
    command = f"python -m {MODULE} {shlex.join(argv)}"
    if args.run:
        run_child(args, output, command)
        return ""
    import fcos_d2  # noqa: F401
    from fcos_d2.data import prepare_dataset

    if args.iters is None:
        args.iters = base_max_iter()
    if args.by_size or args.reevaluate:
        return score_stored(args, output, command)
    names = list(args.contenders)
    if "sipmask" in names and not SIPMASK_CONFIG.is_file():
        print(f"{SIPMASK_CONFIG.relative_to(REPO)} is missing: the 'sipmask' contender is "
              "left out", flush=True)
        names.remove("sipmask")
    output.mkdir(parents=True, exist_ok=True)
    prepare_dataset(data.train)  # once here, so that the runs never race to make them
    prepare_dataset(val_dataset(args.val_images, args.regime))
    results_file = output / "results.jsonl"
    keys = {(c, s): run_key(setup_cfg(c, s, "", args.iters, args.opts, args.val_images,
                                      args.regime))
            for c in names for s in args.seeds}

    def matches(row: dict) -> bool:  # rows stored without a model digest run again
        key = {"regime": row["regime"], "model": row.get("model")}
        return keys.get((row["contender"], row["seed"])) == key

    valid = [r for r in load_results(results_file) if matches(r)]
    done = {(r["contender"], r["seed"]) for r in valid}
    todo = [(c, s) for s in args.seeds for c in names if (c, s) not in done]
    sizes_args = [] if args.val_images is None else ["--val-images", str(args.val_images)]
    run_all(todo, args.jobs, output, ["--iters", str(args.iters), "--regime", args.regime,
                                      *sizes_args, *args.opts],
            module_command(MODULE))
    latency = measure_latency(names, output, args.iters, args.opts, args.latency_images,
                              args.val_images, regime=args.regime)
    (output / "latency.json").write_text(json.dumps(latency, indent=1) + "\n")
    if latency:
        records.append_record(latency_record(latency, command, args.opts, args.iters,
                                             args.regime))
    valid = [r for r in load_results(results_file) if matches(r)]
    table = summarise(valid, latency, list(CONTENDERS))
    (output / "table.md").write_text(table + "\n")
    print(table)
    return table


def score_stored(args, output: Path, command: str) -> str:
    """``--by-size`` / ``--reevaluate``: the stored runs scored again (module
    ``benchmarks.masks.reevaluate``); returns and prints their records' AP, per size too."""
    runs = stored.stored_runs(output, args.contenders, args.seeds)
    if not runs:
        raise SystemExit(f"benchmarks.masks: no stored run of {args.contenders} with seeds "
                         f"{args.seeds} under {output / 'runs'}")
    if args.reevaluate:
        made = stored.reevaluate(output, runs, stored.parse_assignments(args.reevaluate),
                                 args.iters, command, args.opts,
                                 lambda *a: setup_cfg(*a, val_images=args.val_images,
                                                      regime=args.regime), args.regime)
    else:
        made = stored.by_size(output, runs, val_dataset(args.val_images, args.regime),
                              args.iters, command, args.opts, args.regime)
    lines = []
    for record in made:
        run, metrics = record["run"], record["metrics"]
        for task in ("box", "mask"):
            found = metrics.get(f"{task}_by_size", {})
            lines.append(f"{run['contender']} seed {record['seed']} {task}: " + ", ".join(
                f"{label} {value:.1f}" for label, value in found.items()))
    print("\n".join(lines))
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                     description=package.__doc__.split("\n\n")[0])
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS),
                        choices=CONTENDERS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--iters", type=int, default=None,
                        help="training iterations of every run (the base schedule scaled); "
                             "default: the base config's SOLVER.MAX_ITER")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    parser.add_argument("--regime", choices=sorted(REGIMES), default="quickstart",
                        help="quickstart: the mask quickstart's 128-px shapes (default); "
                             "thin: 256-352 px images of thin and filled shapes, 10 classes")
    parser.add_argument("--val-images", type=int, default=None,
                        help="score on the first N val images (default all: 300 quickstart, "
                             "100 thin)")
    parser.add_argument("--latency-images", type=int, default=100,
                        help="val images timed per contender (0: none)")
    parser.add_argument("--output", default=None,
                        help="default output/mask_quality (quickstart), "
                             "output/mask_quality_thin (thin)")
    parser.add_argument("--by-size", action="store_true",
                        help="score the stored runs' saved detections per object size "
                             "(a record each) instead of training")
    parser.add_argument("--reevaluate", action="append", default=[], metavar="KEY=VALUE",
                        help="evaluate the stored runs' weights again with this key changed "
                             "(repeatable; a record each) instead of training")
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[],
                        help="config overrides for every contender (KEY VALUE ...); use a "
                             "separate --output for runs with other overrides")
    add_child_arguments(parser)  # child: one contender and one seed
    return parser


if __name__ == "__main__":
    main()
