#!/usr/bin/env python
"""Kill/resume soak (issue 53): trainings killed by SIGKILL and resumed must end with
final weights equal, bit for bit, to an uninterrupted run's.

    python tools/soak_resume.py --tries 50
    python tools/soak_resume.py --tries 30 --small --variants training-workers-2
    python tools/soak_resume.py --replay 17          # one try again, from its seed

Each try is a short training of configs/quickstart.yaml (``fcos-d2-train``'s command line,
in a fork of this process) on 8 synthetic
images of 128x160 registered with --register-coco (SOLVER.MAX_ITER 80, CHECKPOINT_PERIOD
10, SEED 3, INPUT.RANDOM_FLIP none, TEST.EVAL_PERIOD 0; ``--small``: a narrower model and
MAX_ITER 40), killed with SIGKILL (its whole process group: the workers too), then run
again with --resume until it ends (a resume is itself killed again on some tries). The
try's seed alone chooses its plan (``plan_for``): the variant (``VARIANTS``: 0 loader
workers, 2 loader workers, 2 training workers over gloo), where the first kill lands
(uniform over the uninterrupted run's time, or, on a share of the tries, inside a
checkpoint write: after the temporary file is written or after its rename, of a periodic
checkpoint, model_final.pth or last_checkpoint, through the test pause of
fcos_d2/checkpoint/atomic.py), further kills, and a CPU-hogging process beside it.

A try passes when the last run exits 0 and OUTPUT_DIR/model_final.pth holds the same
tensors as the uninterrupted run of its variant (trained once, in WORK/reference-*).
Passing tries' folders are removed; a failure keeps its folder (logs of every run, the
output folder) and prints its seed. The last line is the summary.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from fcos_d2.checkpoint.atomic import PAUSE_VARIABLE
from fcos_d2.checkpoint.safe_load import load_torch_file
from fcos_d2.config import get_config_file
from fcos_d2.data import synthetic
from fcos_d2.engine.trainer import run_from_command_line

VARIANTS = ("plain", "loader-workers-2", "training-workers-2")
AIMED_SHARE = 0.4  # of the first kills: inside a checkpoint write
AGAIN_SHARE = 0.25  # chance of each further kill of a resume (at most 2)
HOG_SHARE = 0.25  # tries with a CPU-hogging process beside the training
SMALL = ["MODEL.FPN.OUT_CHANNELS", "32", "MODEL.FCOS.NUM_CONVS", "1", "SOLVER.IMS_PER_BATCH", "4"]


@dataclass(frozen=True)
class Kill:
    """Where a run is killed: after ``fraction`` of the uninterrupted run's wall time, or
    in the pause ``STAGE:NAME:COUNT`` of a checkpoint write (PAUSE_VARIABLE)."""
    fraction: Optional[float] = None
    pause: Optional[str] = None


@dataclass(frozen=True)
class Plan:
    seed: int
    variant: str
    kills: Tuple[Kill, ...]  # of the first run, then of each resume in turn
    hog: bool


@dataclass
class Result:
    plan: Plan
    failure: Optional[str] = None  # its kind; None: exact
    kills_landed: int = 0
    aimed_landed: bool = False
    folder: Optional[Path] = None
    notes: List[str] = field(default_factory=list)


def checkpoint_names(max_iter: int, period: int) -> List[str]:
    """The files a run writes, in order: model_<i>.pth after each period, then model_final."""
    return [f"model_{i:07d}.pth" for i in range(period - 1, max_iter, period)] + \
        ["model_final.pth"]


def plan_for(seed: int, max_iter: int, period: int) -> Plan:
    """The try of ``seed``: the same plan every time (``--replay``)."""
    rng = random.Random(seed)
    variant = VARIANTS[seed % len(VARIANTS)]
    hog = rng.random() < HOG_SHARE
    if rng.random() < AIMED_SHARE:
        saves = checkpoint_names(max_iter, period)
        index = rng.randrange(len(saves))
        stage = rng.choice(("written", "renamed"))
        # last_checkpoint is rewritten after each save: its index+1-th write follows saves[index]
        name, count = ((saves[index], 1) if rng.random() < 0.5
                       else ("last_checkpoint", index + 1))
        kills = [Kill(pause=f"{stage}:{name}:{count}")]
    else:
        kills = [Kill(fraction=rng.random())]
    while len(kills) < 3 and rng.random() < AGAIN_SHARE:
        kills.append(Kill(fraction=rng.random()))
    return Plan(seed, variant, tuple(kills), hog)


def summary(results: Sequence[Result]) -> str:
    """One line: tries and exact ones per variant, kills, and failures by kind."""
    exact = sum(r.failure is None for r in results)
    per_variant = ", ".join(
        f"{v} {sum(r.failure is None for r in results if r.plan.variant == v)}/"
        f"{sum(r.plan.variant == v for r in results)}"
        for v in VARIANTS if any(r.plan.variant == v for r in results))
    kinds = Counter(r.failure for r in results if r.failure is not None)
    failures = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none"
    return (f"soak_resume: {len(results)} tries, {exact} exact ({per_variant or 'no tries'}); "
            f"failures: {failures}; kills landed {sum(r.kills_landed for r in results)} "
            f"({sum(r.aimed_landed for r in results)} inside checkpoint writes), "
            f"{sum(r.plan.hog for r in results)} tries beside a CPU hog")


# -- the trainings ----------------------------------------------------------------------
def write_dataset(folder: Path) -> Path:
    """8 synthetic shapes images widened to 128x160 (edge pixels repeated on the right)."""
    synthetic.write_split(folder, split="train", num_images=8)
    coco = json.loads((folder / "annotations.json").read_text())
    for image in coco["images"]:
        path = folder / "images" / image["file_name"]
        pixels = np.asarray(Image.open(path))
        Image.fromarray(np.pad(pixels, ((0, 0), (0, 32), (0, 0)), mode="edge")).save(path)
        image["width"] = 160
    (folder / "annotations.json").write_text(json.dumps(coco))
    return folder


def training_argv(args, data: Path, variant: str, output: Path) -> List[str]:
    argv = ["--config-file", get_config_file("quickstart.yaml"), "--register-coco", "soak",
            str(data / "annotations.json"), str(data / "images")]
    if variant == "training-workers-2":
        argv += ["--num-gpus", "2"]
    workers = "2" if variant == "loader-workers-2" else "0"
    return argv + [
        "MODEL.DEVICE", "cpu", "SEED", "3", "INPUT.RANDOM_FLIP", "none",
        "DATALOADER.NUM_WORKERS", workers, "TEST.EVAL_PERIOD", "0",
        "SOLVER.MAX_ITER", str(args.max_iter), "SOLVER.CHECKPOINT_PERIOD", str(args.period),
        "DATASETS.TRAIN", "('soak',)", "DATASETS.TEST", "('soak',)",
        *(SMALL if args.small else []), "OUTPUT_DIR", str(output)]


def run_training(argv: List[str], log: Path, kill: Optional[Kill], duration: float,
                 timeout: float) -> Tuple[Optional[int], str]:
    """Runs fcos-d2-train ``argv`` in a fork of this process (which imported it once: a
    fresh interpreter spends seconds on imports, where most timed kills would land), in a
    session of its own, so that a kill takes its workers too. Returns (exit status or
    None, "killed" | "ended" | "timeout")."""
    marker = log.with_suffix(".paused")
    pause = {PAUSE_VARIABLE: f"{kill.pause}:{marker}"} if kill is not None and kill.pause else {}
    pid = _forked(_train, argv, log, pause)
    started = time.time()
    kill_at = started + kill.fraction * duration if kill and kill.fraction is not None else None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), "ended"
        now = time.time()
        due = (kill_at is not None and now >= kill_at) or marker.exists()
        if due or now - started > timeout:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None, "killed" if due else "timeout"
        time.sleep(0.02)


def _forked(function, *args) -> int:
    """Runs ``function(*args)`` in a child process; returns its pid. This process only
    imports and forks: it computes nothing with torch (its thread pools stay unstarted)."""
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setsid()
        code = function(*args)
    except SystemExit as error:  # Preempted: 75
        code = error.code if isinstance(error.code, int) else int(error.code is not None)
    except BaseException:  # noqa: BLE001  (the child's traceback goes to its log)
        traceback.print_exc()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)


def _train(argv: List[str], log: Path, env: dict) -> int:
    """In the fork: the training's output to ``log``, then fcos-d2-train's command line."""
    descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(descriptor, 1), os.dup2(descriptor, 2)
    os.environ.pop(PAUSE_VARIABLE, None)
    os.environ.update(env)
    run_from_command_line(argv)
    return 0


def _judged(path: Path, reference: Path) -> Optional[str]:
    """``same_weights`` in a fork (it computes with torch; see ``_forked``)."""
    codes = {None: 0, "missing-final": 10, "unreadable-final": 11, "weights-differ": 12}
    pid = _forked(lambda: codes[same_weights(path, reference)])
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return next((kind for kind, c in codes.items() if c == code), f"judge-exit-{code}")


def same_weights(path: Path, reference: Path) -> Optional[str]:
    """None when both files' "model" tensors are equal bit for bit, else the failure kind."""
    if not path.is_file():
        return "missing-final"
    try:
        ours, theirs = load_torch_file(str(path))["model"], load_torch_file(str(reference))["model"]
    except Exception:  # noqa: BLE001  (any damage is this kind of failure)
        return "unreadable-final"
    if ours.keys() != theirs.keys() or any(
            ours[k].dtype != theirs[k].dtype or not ours[k].equal(theirs[k]) for k in ours):
        return "weights-differ"
    return None


def reference_run(args, data: Path, variant: str) -> Tuple[Path, float]:
    """The uninterrupted run of ``variant`` (reused when its settings are the same):
    (its model_final.pth, its wall time in seconds)."""
    folder = args.work_dir / f"reference-{variant}"
    settings = training_argv(args, data, variant, folder / "output")
    record = folder / "reference.json"
    if record.is_file() and json.loads(record.read_text())["argv"] == settings:
        return folder / "output" / "model_final.pth", json.loads(record.read_text())["seconds"]
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    started = time.time()
    status, how = run_training(settings, folder / "run.log", None, 0.0, timeout=3600)
    if status != 0:
        raise SystemExit(f"soak_resume: the uninterrupted {variant} run failed ({how}, status "
                         f"{status}); see {folder / 'run.log'}")
    seconds = time.time() - started
    record.write_text(json.dumps({"argv": settings, "seconds": seconds}))
    return folder / "output" / "model_final.pth", seconds


def start_hog() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)


def run_try(args, data: Path, plan: Plan, reference: Path, duration: float) -> Result:
    """One try of ``plan`` in WORK/try-<seed>: the killed run, the resumes, the verdict."""
    result = Result(plan, folder=args.work_dir / f"try-{plan.seed}")
    shutil.rmtree(result.folder, ignore_errors=True)
    result.folder.mkdir(parents=True)
    (result.folder / "plan.json").write_text(json.dumps(
        {"seed": plan.seed, "variant": plan.variant, "hog": plan.hog,
         "kills": [k.__dict__ for k in plan.kills]}))
    argv = training_argv(args, data, plan.variant, result.folder / "output")
    hog = start_hog() if plan.hog else None
    try:
        result.failure = _runs_of(result, argv, duration)
    finally:
        if hog is not None:
            os.killpg(hog.pid, signal.SIGKILL)
            hog.wait()
    if result.failure is None:
        result.failure = _judged(result.folder / "output" / "model_final.pth", reference)
    return result


def _runs_of(result: Result, argv: List[str], duration: float) -> Optional[str]:
    """The first run and the resumes; the kind of failure of a run that was not killed and
    did not exit 0, or None."""
    timeout = 10 * duration + 120
    kills = list(result.plan.kills)
    for attempt in range(len(kills) + 3):
        kill = kills[attempt] if attempt < len(kills) else None
        run_argv = argv if attempt == 0 else ["--resume", *argv]
        status, how = run_training(run_argv, result.folder / f"run{attempt}.log", kill,
                                   duration, timeout)
        result.notes.append(f"run{attempt}: {how}" + ("" if status is None else f" {status}"))
        if how == "timeout":
            return "timeout"
        if how == "killed":
            result.kills_landed += 1
            result.aimed_landed |= kill.pause is not None
            continue
        if status != 0:
            return f"{'resume-' if attempt else ''}exit-{status}"
        return None
    return "too-many-runs"  # not reached: only planned kills end a run early


def main(argv: Optional[List[str]] = None) -> int:
    args = argument_parser().parse_args(argv)
    args.work_dir = args.work_dir.resolve()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    args.max_iter = args.max_iter or (40 if args.small else 80)
    data = args.work_dir / "data"
    if not (data / "annotations.json").is_file():
        write_dataset(data)
    seeds = [args.replay] if args.replay is not None else [
        s for s in range(args.seed, args.seed + 10 * args.tries)
        if VARIANTS[s % len(VARIANTS)] in args.variants][:args.tries]
    references, results, started = {}, [], time.time()
    for seed in seeds:
        if args.minutes and time.time() - started > 60 * args.minutes:
            print(f"soak_resume: --minutes {args.minutes} reached; no further tries", flush=True)
            break
        plan = plan_for(seed, args.max_iter, args.period)
        if plan.variant not in references:
            references[plan.variant] = reference_run(args, data, plan.variant)
        result = run_try(args, data, plan, *references[plan.variant])
        results.append(result)
        print(f"try seed {seed} ({plan.variant}{', CPU hog' if plan.hog else ''}): "
              f"{result.failure or 'exact'} [{'; '.join(result.notes)}]", flush=True)
        if result.failure is None and args.replay is None:
            shutil.rmtree(result.folder)
        elif result.failure is not None:
            print(f"FAILED seed {seed}: {result.failure}; kept in {result.folder}; replay: "
                  f"python tools/soak_resume.py --replay {seed}{' --small' * args.small}",
                  flush=True)
    print(summary(results), flush=True)
    return 0 if all(r.failure is None for r in results) else 1


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=50, help="how many tries (default 50)")
    parser.add_argument("--seed", type=int, default=0, help="the first try's seed")
    parser.add_argument("--replay", type=int, default=None, metavar="SEED",
                        help="run only the try of SEED, and keep its folder")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="only the tries of these variants (a seed's variant is "
                             "VARIANTS[seed %% 3])")
    parser.add_argument("--small", action="store_true",
                        help="a narrower model and MAX_ITER 40: about 3x faster")
    parser.add_argument("--max-iter", type=int, default=None,
                        help="SOLVER.MAX_ITER (default 80; 40 with --small)")
    parser.add_argument("--period", type=int, default=10, help="SOLVER.CHECKPOINT_PERIOD")
    parser.add_argument("--minutes", type=float, default=0,
                        help="start no try after this many minutes (0: no limit)")
    parser.add_argument("--work-dir", type=Path, default=Path("output/soak_resume"))
    return parser


if __name__ == "__main__":
    sys.exit(main())
