"""What the benchmarks that train share: a pool of child processes, one run each, a hook that
keeps the losses, and reading the JSON-lines files the runs append to.

``benchmarks.train_quality`` and ``benchmarks.masks`` run each (contender, seed) in its own
process with one thread, ``jobs`` at a time: ``python -m <module> --run NAME --seed SEED
--output OUTPUT EXTRA_ARGS OPTS`` from the repository's root.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

REPO = Path(__file__).resolve().parents[1]
# storage scalars that are not losses (detectron2's and fcos-d2's)
NOT_LOSSES = {"data_time", "rank_data_time", "lr", "time", "eta_seconds", "num_pos_anchors"}
TRAINING_PROGRESS = "training"  # the desc of a child's iteration_progress lines
CHILD_LOOK_SECONDS = 30.0  # how often run_all reads where its children are
# detectron2's CommonMetricPrinter line ("... eta: 0:01:23  iter: 199  total_loss: ..."):
# where a child without the iteration_progress hook (the library trainer's) is
METRIC_PRINTER = re.compile(r"\beta: (?P<eta>\S+)\s+iter: (?P<iter>\d+)\b")

# can_start(name, seed, waiting): whether (name, seed) may start while the pairs of
# `waiting` (queued or running) have not finished
CanStart = Callable[[str, int, Set[Tuple[str, int]]], bool]


def module_command(module: str) -> List[str]:
    """The command that runs `module` (``benchmarks.x``) with this interpreter."""
    return [sys.executable, "-m", module]


def child_environment() -> Dict[str, str]:
    """This environment with one thread per child and the repository first on PYTHONPATH,
    so that ``python -m benchmarks.x`` finds the package from any working directory."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=path)


def next_ready(todo: List[Tuple[str, int]], running: List[tuple],
               can_start: Optional[CanStart] = None) -> Optional[int]:
    """The index of the first (name, seed) of `todo` that `can_start` allows (every one
    without it), while the rest of `todo` and the `running` (name, seed, ...) wait; None if
    none can start."""
    waiting = set(todo) | {(r[0], r[1]) for r in running}
    for index, (name, seed) in enumerate(todo):
        if can_start is None or can_start(name, seed, waiting):
            return index
    return None


def add_child_arguments(parser: argparse.ArgumentParser) -> None:
    """The hidden flags with which ``run_all`` starts a child process: ``--run`` (one
    contender, or one E) and ``--seed``."""
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)


def run_all(todo: List[Tuple[str, int]], jobs: int, output: Path, opts: Sequence[str],
            command: Sequence[str], extra_args: Sequence[str] = (),
            can_start: Optional[CanStart] = None) -> None:
    """Runs each (name, seed) of `todo` in a child process, `jobs` at a time: ``command
    --run NAME --seed SEED --output OUTPUT EXTRA_ARGS OPTS``, its output going to
    ``OUTPUT/log-<name>-<seed>.txt``. `todo` is consumed. Each finished run prints the runs
    done and to go and the ETA; between them, ``fcos_d2.progress`` shows a bar on a
    terminal, or a line a minute in a log, with where each running child is (the iteration
    and ETA its ``iteration_progress`` hook last wrote to its log)."""
    from fcos_d2.progress import Progress

    env, running, last_look, looked = child_environment(), [], time.time(), False
    progress = Progress(len(todo), "benchmark runs", "runs")
    while todo or running:
        while len(running) < jobs and next_ready(todo, running, can_start) is not None:
            name, seed = todo.pop(next_ready(todo, running, can_start))
            log = open(output / _log_name(name, seed), "w")
            argv = [*command, "--run", name, "--seed", str(seed), "--output", str(output),
                    *extra_args, *opts]
            process = subprocess.Popen(argv, env=env, cwd=REPO, stdout=log,
                                       stderr=subprocess.STDOUT)
            running.append((name, seed, process, time.time()))
            print(f"started {name} seed {seed}", flush=True)
        for item in list(running):
            name, seed, process, started = item
            if process.poll() is not None:
                running.remove(item)
                progress.update(1)
                print(f"finished {name} seed {seed}: exit {process.returncode}, "
                      f"{time.time() - started:.0f} s; {_runs_left(progress)}", flush=True)
        if time.time() - last_look >= CHILD_LOOK_SECONDS:  # where each running child is
            progress.update(0, running=_children_status(running, output))
            last_look, looked = time.time(), True
        progress.update(0)  # a line a minute in a log while the runs go on
        time.sleep(1)
    if looked:
        progress.update(0, running="-")  # none is left
    progress.close()


def _children_status(running: List[tuple], output: Path) -> str:
    """``"fad paper seed 1 at 1200/4200 iterations (29%), ETA 1 h 3 min; ..."``: each
    running child's latest ``training:`` line (``iteration_progress``) in its log, else its
    latest line of detectron2's metric printer (``"e12 seed 0 at iteration 200, ETA
    0:01:23"``: the library trainer's children, benchmarks.epochs'); ``"-"`` when none has
    written either yet."""
    found = []
    for name, seed, *_ in running:
        where = _where(_log_tail(output / _log_name(name, seed)))
        if where:
            found.append(f"{name} seed {seed} at {where}")
    return "; ".join(found) or "-"


def _where(lines: List[str]) -> Optional[str]:
    """The iteration and ETA of the latest progress line of `lines`: an ``iteration_progress``
    line, or else a metric printer's (its iteration counted from 1, as the hook counts)."""
    prefix = TRAINING_PROGRESS + ": "
    for line in reversed(lines):
        if line.startswith(prefix):
            parts = line[len(prefix):].split(", ")
            return ", ".join([parts[0], *(p for p in parts if p.startswith("ETA"))])
    for line in reversed(lines):
        match = METRIC_PRINTER.search(line)
        if match:
            return f"iteration {int(match['iter']) + 1}, ETA {match['eta']}"
    return None


def _log_tail(path: Path, tail_bytes: int = 16384) -> List[str]:
    """The lines of `path`'s last `tail_bytes`; none while there is no file."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            return f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []


def _log_name(name: str, seed: int) -> str:
    return f"log-{name.replace(' ', '_')}-{seed}.txt"


def _runs_left(progress) -> str:
    """``"2 runs done, 3 to go, ETA 4 min 10 s"``."""
    from fcos_d2.progress import format_seconds

    eta = progress.eta_seconds()
    return (f"{progress.done} runs done, {progress.total - progress.done} to go"
            + ("" if eta is None else f", ETA {format_seconds(eta)}"))


def loss_recorder():
    """A detectron2 hook that keeps each loss's values; ``tail()`` gives their median over
    the last 100 iterations."""
    from detectron2.engine import HookBase

    class LossRecorder(HookBase):
        def __init__(self):
            self.values: Dict[str, List[float]] = {}

        def after_step(self):
            for key, (value, _) in self.trainer.storage.latest().items():
                if key not in NOT_LOSSES:
                    self.values.setdefault(key, []).append(float(value))

        def tail(self) -> Dict[str, float]:
            return {k: round(statistics.median(v[-100:]), 4) for k, v in self.values.items()}

    return LossRecorder()


def iteration_progress():
    """A detectron2 hook that reports a child's iterations (``fcos_d2.progress``: in a log,
    ``"training: 1200/4200 iterations (29%), ..., loss=0.412"`` at most once a minute), which
    ``run_all`` reads back from the child's log."""
    from detectron2.engine import HookBase

    from fcos_d2.progress import Progress

    class IterationProgress(HookBase):
        def before_train(self):
            self.progress = Progress(self.trainer.max_iter, TRAINING_PROGRESS, "iterations",
                                     initial=self.trainer.start_iter)

        def after_step(self):
            total = self.trainer.storage.latest().get("total_loss")  # the trainer's sum
            self.progress.update(1, **({} if total is None else {"loss": f"{total[0]:.3f}"}))

        def after_train(self):
            self.progress.close()

    return IterationProgress()


def load_results(path: Path) -> List[dict]:
    """The JSON lines of `path` (a benchmark's OUTPUT/results.jsonl); [] if there is none."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_results(path: Path, results: Sequence[dict]) -> None:
    """Appends `results` to the JSON-lines file `path`, one line each, in one write."""
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in results))
