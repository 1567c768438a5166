"""One run of the AP-against-epochs benchmark (``benchmarks.epochs``): the recipe's schedule
scaled to E epochs, the trainer's command line for a (regime, E, seed), the curve that the
run's evaluations leave in its output folder, and its record."""
import json
import time
from pathlib import Path
from typing import Dict, List, Sequence

from benchmarks import records
from benchmarks.train_quality import protocol

BENCHMARK = "epochs"  # benchmarks/results/epochs.jsonl
CONFIG = protocol.CONFIG  # the small-data recipe
# the settings that make two runs of the same seed and overrides the same run
SETTINGS = ("regime", "epochs", "eval_every", "train_images", "val_images")


def schedule_overrides(epochs: int, eval_every: int) -> List[str]:
    """The recipe's schedule scaled to `epochs`: LR step at 5/6, warm-up 1/12 (floats for
    the float keys), an evaluation every `eval_every` epochs and one checkpoint at the end."""
    return ["SOLVER.EPOCHS", str(epochs), "SOLVER.STEPS_EPOCHS", f"({round(epochs * 5 / 6, 4)},)",
            "SOLVER.WARMUP_EPOCHS", repr(round(epochs / 12, 4)),
            "TEST.EVAL_PERIOD_EPOCHS", str(eval_every),
            "SOLVER.CHECKPOINT_PERIOD_EPOCHS", str(epochs)]


def regime_images(regime: str) -> Dict[str, int]:
    """split -> the number of images the training-quality protocol takes from it."""
    return {split: count for _, split, count in protocol.REGIMES[regime].datasets}


def data_folders(regime: str, images: Dict[str, int]) -> Dict[str, Path]:
    """split -> the folder of its first ``images[split]`` images (generated unless cached)."""
    return {split: protocol.ensure_split(regime, split, count) for split, count in images.items()}


def run_folder(output: Path, epochs: int, seed: int) -> Path:
    return Path(output) / f"e{epochs}_s{seed}"


def trainer_argv(regime: str, folders: Dict[str, Path], seed: int, epochs: int,
                 eval_every: int, output: Path, opts: Sequence[str]) -> List[str]:
    """The library trainer's (train_net.py's) arguments for one run: the recipe, the regime's
    data (registered as ``epochs_<regime>_<split>``) and overrides, the scaled schedule, then
    `opts`; its OUTPUT_DIR is ``run_folder(output, epochs, seed)``. The config file is
    named from the repository's root, where the runs and the printed commands run."""
    from fcos_d2.data.synthetic import ANNOTATIONS_FILE, IMAGES_FOLDER

    registered = []
    for split, folder in folders.items():
        registered += ["--register-coco", f"epochs_{regime}_{split}",
                       str(folder / ANNOTATIONS_FILE), str(folder / IMAGES_FOLDER)]
    return ["--config-file", str(CONFIG.relative_to(protocol.REPO)), *registered,
            *(str(value) for value in protocol.REGIMES[regime].overrides),
            "DATASETS.TRAIN", f"('epochs_{regime}_train',)",
            "DATASETS.TEST", f"('epochs_{regime}_val',)", "DATALOADER.NUM_WORKERS", "0",
            "SEED", str(seed), *schedule_overrides(epochs, eval_every), *opts,
            "OUTPUT_DIR", str(run_folder(output, epochs, seed))]


def solver_of(folder: Path) -> dict:
    """The SOLVER node of the config.yaml that the run in `folder` saved (its iteration
    keys derived from the epochs)."""
    import yaml

    return yaml.safe_load((Path(folder) / "config.yaml").read_text())["SOLVER"]


def read_curve(folder: Path) -> List[dict]:
    """Every evaluation of the run in `folder`: {"epochs": epochs trained, "AP", "AP50"},
    from its metrics.json and the schedule in its config.yaml (iterations per epoch =
    MAX_ITER / EPOCHS; an evaluation after iteration i (0-based) follows i + 1 of them).
    metrics.json keeps the latest value of a key at each write (every 20 iterations), so of
    evaluations closer than that only the last one is there."""
    solver = solver_of(folder)
    per_epoch = solver["MAX_ITER"] / solver["EPOCHS"]
    points = []
    for line in (folder / "metrics.json").read_text().splitlines():
        metrics = json.loads(line)
        if "bbox/AP" in metrics:
            iterations = min(metrics["iteration"] + 1, solver["MAX_ITER"])
            points.append({"epochs": round(iterations / per_epoch, 2), "AP": metrics["bbox/AP"],
                           "AP50": metrics.get("bbox/AP50")})
    return points


def run_record(settings: Dict, *, seed: int, opts: Sequence[str], command: str,
               evaluations: List[dict], iterations: int, seconds: float, threads: int) -> dict:
    """The ``benchmarks.records`` record of one run: the final AP and AP50, the curve as
    [epochs, AP] pairs; `settings` (``SETTINGS``), iterations and threads under "run"."""
    final = evaluations[-1]
    metrics = {"AP": final["AP"], "AP50": final["AP50"],
               "curve": [[point["epochs"], point["AP"]] for point in evaluations]}
    return records.make_record(
        BENCHMARK, command=command, seed=seed, overrides=opts, metrics=metrics,
        times={"train_and_eval_seconds": round(seconds, 1)},
        run={**settings, "iterations": iterations, "threads": threads})


def is_run_of(record: dict, settings: Dict, seed: int, opts: Sequence[str]) -> bool:
    """Whether `record` is the run of `seed` with `settings` and the overrides `opts`."""
    return (record["seed"] == seed and record["overrides"] == [str(o) for o in opts]
            and all(record["run"].get(key) == settings[key] for key in SETTINGS))


def run_one(settings: Dict, seed: int, output: Path, opts: Sequence[str], command: str,
            threads: int = 1) -> dict:
    """Trains and evaluates one run in this process (``run_from_command_line``, as
    train_net.py); appends its record to ``output/results.jsonl`` and to the repository's
    records file, and returns it."""
    import torch

    from fcos_d2.engine.trainer import run_from_command_line

    torch.set_num_threads(threads)
    regime, epochs = settings["regime"], settings["epochs"]
    folders = data_folders(regime, {"train": settings["train_images"],
                                    "val": settings["val_images"]})
    start = time.perf_counter()
    run_from_command_line(trainer_argv(regime, folders, seed, epochs, settings["eval_every"],
                                       output, opts))
    seconds = time.perf_counter() - start
    folder = run_folder(output, epochs, seed)
    evaluations = read_curve(folder)
    if not evaluations:
        raise SystemExit(f"{folder / 'metrics.json'}: no evaluation (bbox/AP) in it; see "
                         f"{folder / 'log.txt'}")
    record = run_record(settings, seed=seed, opts=opts, command=command,
                        evaluations=evaluations, iterations=solver_of(folder)["MAX_ITER"],
                        seconds=seconds, threads=threads)
    records.append_record(record, Path(output) / "results.jsonl")
    records.append_record(record)
    return record

