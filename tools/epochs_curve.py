#!/usr/bin/env python
"""AP against epochs for the small-data recipe (configs/FCOS-R18-small-data.yaml): how long
a training on a few hundred images pays.

Each (epochs E, seed) trains the recipe through train_net.py with its schedule in epochs,
the recipe's proportions scaled to E: SOLVER.EPOCHS E, the LR step at 5/6 of E and a
linear warm-up of E/12 (the recipe's 1000 and 100 of 1200 iterations), evaluating every
``--eval-every`` epochs (each evaluation is a point of the curve along that run) and at the
end (the point at E). The data are a benchmark regime of tools/train_quality.py: the first
400 train and 100 val images of the synthetic shapes ("shapes": 128 px, 6 classes) or of
the thin objects ("thin": 256-352 px, 10 classes).

Every run appends a record (commit, CPU kind, regime, seed, epochs, iterations, final
metrics, the curve, seconds) to ``OUTPUT/results.jsonl``; runs found there are not
repeated. The table (final AP at each E: mean, sample std and range over the seeds) is
printed and written to ``OUTPUT/table.md``.

    python tools/epochs_curve.py --regime thin --epochs 12 24 36 48 --seeds 0 1 2
    python tools/epochs_curve.py --regime shapes --dry-run   # the commands only
    python tools/epochs_curve.py ... MODEL.DEVICE cuda        # KEY VALUE: more overrides
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
CONFIG = "configs/FCOS-R18-small-data.yaml"
# regime -> (generator, overrides its data need on top of the recipe): tools/train_quality.py
REGIMES = {
    "shapes": ("shapes", []),
    "thin": ("thin", ["MODEL.FCOS.NUM_CLASSES", "10", "INPUT.MIN_SIZE_TRAIN", "(256,)",
                      "INPUT.MAX_SIZE_TRAIN", "352", "INPUT.MIN_SIZE_TEST", "256",
                      "INPUT.MAX_SIZE_TEST", "352"]),
}


def schedule_overrides(epochs: int, eval_every: int) -> List[str]:
    """The recipe's schedule scaled to ``epochs``: step at 5/6, warm-up 1/12 (floats for
    the float keys), evaluation every ``eval_every`` epochs, one checkpoint at the end."""
    return ["SOLVER.EPOCHS", str(epochs), "SOLVER.STEPS_EPOCHS", f"({round(epochs * 5 / 6, 4)},)",
            "SOLVER.WARMUP_EPOCHS", repr(round(epochs / 12, 4)),
            "TEST.EVAL_PERIOD_EPOCHS", str(eval_every), "SOLVER.CHECKPOINT_PERIOD_EPOCHS",
            str(epochs)]


def data_folders(regime: str, train_images: int, val_images: int) -> Dict[str, Path]:
    """The regime's train and val folders (generated unless cached)."""
    from fcos_d2.data.synthetic import ensure_synthetic_shapes
    from fcos_d2.data.synthetic_thin import ensure_synthetic_thin

    ensure = {"shapes": ensure_synthetic_shapes, "thin": ensure_synthetic_thin}[REGIMES[regime][0]]
    return {"train": ensure("train", num_images=train_images),
            "val": ensure("val", num_images=val_images)}


def command(regime: str, folders: Dict[str, Path], seed: int, epochs: int, eval_every: int,
            output: Path, opts: List[str]) -> List[str]:
    registered = []
    for split, folder in folders.items():
        registered += ["--register-coco", f"epochs_curve_{regime}_{split}",
                       str(folder / "annotations.json"), str(folder / "images")]
    return [sys.executable, "train_net.py", "--config-file", CONFIG, *registered,
            *REGIMES[regime][1], "DATASETS.TRAIN", f"('epochs_curve_{regime}_train',)",
            "DATASETS.TEST", f"('epochs_curve_{regime}_val',)", "DATALOADER.NUM_WORKERS", "0",
            "SEED", str(seed), *schedule_overrides(epochs, eval_every), *opts,
            "OUTPUT_DIR", str(output)]


def curve(output: Path) -> List[List[float]]:
    """[(epochs trained, bbox AP)] of every evaluation of a run, from its metrics.json and
    the schedule in its config.yaml (iterations per epoch = MAX_ITER / EPOCHS, rounded)."""
    import yaml

    solver = yaml.safe_load((output / "config.yaml").read_text())["SOLVER"]
    per_epoch = solver["MAX_ITER"] / solver["EPOCHS"]
    points = []
    for line in (output / "metrics.json").read_text().splitlines():
        metrics = json.loads(line)
        if "bbox/AP" in metrics:
            iterations = min(metrics["iteration"] + 1, solver["MAX_ITER"])
            points.append([round(iterations / per_epoch, 2), metrics["bbox/AP"]])
    return points


def cpu_kind() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def run(args, regime: str, seed: int, epochs: int, folders, results: Path) -> None:
    output = Path(args.output) / f"e{epochs}_s{seed}"
    cmd = command(regime, folders, seed, epochs, args.eval_every, output, args.opts)
    if args.dry_run:
        print(" ".join(cmd))
        return
    start = time.time()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"run e{epochs} seed {seed} failed (exit {done.returncode}); its log: "
                         f"{output / 'log.txt'}\n{done.stderr[-3000:]}")
    points = curve(output)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()
    record = {"regime": regime, "seed": seed, "epochs": epochs, "AP": points[-1][1],
              "curve": points, "seconds": round(time.time() - start, 1), "commit": commit,
              "cpu": cpu_kind(), "threads": args.threads, "opts": args.opts}
    with results.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(f"e{epochs} seed {seed}: AP {record['AP']:.1f} in {record['seconds']} s")


def table(records: List[dict]) -> str:
    lines = ["| epochs | seeds | AP mean | std | range | best along the run (mean) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for epochs in sorted({r["epochs"] for r in records}):
        aps = [r["AP"] for r in records if r["epochs"] == epochs]
        peaks = [max(ap for _, ap in r["curve"]) for r in records if r["epochs"] == epochs]
        std = statistics.stdev(aps) if len(aps) > 1 else float("nan")
        lines.append(f"| {epochs} | {len(aps)} | {statistics.mean(aps):.1f} | {std:.1f} | "
                     f"{min(aps):.1f}-{max(aps):.1f} | {statistics.mean(peaks):.1f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regime", choices=sorted(REGIMES), default="shapes")
    parser.add_argument("--epochs", type=int, nargs="+", default=[12, 24, 36, 48])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-every", type=int, default=4, help="epochs between evaluations")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of a run")
    parser.add_argument("--train-images", type=int, default=400)
    parser.add_argument("--val-images", type=int, default=100)
    parser.add_argument("--output", default=None, help="default output/epochs_curve_<regime>")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE overrides")
    args = parser.parse_args(argv)
    args.output = args.output or str(REPO / "output" / f"epochs_curve_{args.regime}")
    folders = data_folders(args.regime, args.train_images, args.val_images)
    results = Path(args.output) / "results.jsonl"
    results.parent.mkdir(parents=True, exist_ok=True)
    done = {(r["seed"], r["epochs"]) for r in _records(results, args.opts)}
    for epochs in args.epochs:
        for seed in args.seeds:
            if (seed, epochs) not in done:
                run(args, args.regime, seed, epochs, folders, results)
    if not args.dry_run and _records(results, args.opts):
        text = table(_records(results, args.opts))
        (Path(args.output) / "table.md").write_text(text + "\n")
        print(text)


def _records(path: Path, opts: List[str]) -> List[dict]:
    """The records of ``path`` made with the overrides ``opts``."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, lines) if r["opts"] == opts]


if __name__ == "__main__":
    main()
