"""The runs of the entry row (``entry_row``) and what their logs say: the subprocesses
(``train_net.py --eval-only``, a fresh ``entry_predictor``) with their threads and cache
folders, torchvision's fp32 loop and ``DefaultPredictor`` in this process, and the parser of
fcos_d2's log lines (auto's choice, a compile's seconds)."""
import contextlib
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

from benchmarks.speed import contenders as bc, entry_predictor as ep

DATASET = "entry_benchmark"  # the name --register-coco gives the row's images

ANSI = re.compile(r"\x1b\[[0-9;]*m")
AUTO_LINE = re.compile(r"MODEL\.FCOS\.INFERENCE_BACKEND auto: [^\n]*")
COMPILED = re.compile(r"Backbone and head (loaded from the cache|compiled) in ([0-9.]+) s")
EXPECTED = re.compile(r"expect about ([0-9.]+) s")


def parse_log(text: str) -> dict:
    """{"auto": auto's line ("" if none), "compiles": [(how, seconds), ...], "compile_s":
    their sum, "expected_s": the "expect about" figures} of a run's log."""
    text = ANSI.sub("", text)
    auto = AUTO_LINE.search(text)
    compiles = [(how, float(s)) for how, s in COMPILED.findall(text)]
    return {"auto": auto.group(0) if auto else "", "compiles": compiles,
            "compile_s": sum((s for _, s in compiles), 0.0),
            "expected_s": [float(s) for s in EXPECTED.findall(text)]}


def cache_env(cache: Path) -> Dict[str, str]:
    """fcos_d2's and inductor's cache folders, both in ``cache`` (inductor's default would
    reuse /tmp/torchinductor_<user>: no cold start)."""
    return {"FCOS_D2_CACHE_DIR": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}


def subprocess_env(threads: int, cache: Path) -> Dict[str, str]:
    threads = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return {**os.environ, **threads, **cache_env(cache)}


def timed_run(command: List[str], env: Dict[str, str]) -> Tuple[float, str]:
    """(wall seconds, stdout and stderr) of ``command`` run in the repository."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=bc.REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"entry row: `{' '.join(command)}` exited with {done.returncode}; "
                           f"the end of its output:\n{done.stdout[-3000:]}")
    return wall, done.stdout


def eval_only_command(data: Tuple[Path, Path], overrides: List[str], output: Path) -> List[str]:
    json_file, image_dir = data
    return [sys.executable, "train_net.py", "--config-file", str(ep.CONFIG), "--eval-only",
            "--register-coco", DATASET, str(json_file), str(image_dir), *overrides,
            "DATASETS.TEST", f"('{DATASET}',)", "OUTPUT_DIR", str(output)]


def fresh_predictor(weights: str, cache: Path, size: Tuple[int, int], paths: List[Path],
                    calls: int, env: Dict[str, str]) -> Tuple[dict, dict]:
    """({"build_s", "first_s", "steady_s"}, the parsed log) of ``entry_predictor`` in a
    fresh process: its first call and the median of ``calls`` after it."""
    command = [sys.executable, "-m", "benchmarks.speed.entry_predictor", weights, str(cache),
               "x".join(map(str, size)), *map(str, paths[:calls + 1]), "--calls", str(calls)]
    _, text = timed_run(command, env)
    result = next(line for line in text.splitlines() if line.startswith(ep.MARK))
    return json.loads(result[len(ep.MARK):]), parse_log(text)


def torchvision_loop(paths: List[Path], size: Tuple[int, int]) -> Tuple[float, float]:
    """(seconds of the loop over ``paths``, median per image) of torchvision's fp32 FCOS,
    after one warm-up image."""
    import torch
    from detectron2.data.detection_utils import read_image

    model = bc.torchvision_contender("cpu", size).model.eval()
    images = [torch.from_numpy(read_image(str(p), format="RGB").copy()).permute(2, 0, 1)
              .float() / 255 for p in paths]  # (H, W, 3) -> (3, H, W), 0..1
    seconds = []
    with torch.no_grad():
        model([images[0]])
        for image in images:
            start = time.perf_counter()
            model([image])
            seconds.append(time.perf_counter() - start)
    return sum(seconds), statistics.median(seconds)


@contextlib.contextmanager
def fcos_d2_log(lines: List[str], variables: Dict[str, str]):
    """Collects fcos_d2's INFO log into ``lines``, with ``variables`` set in the environment."""
    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger, handler = logging.getLogger("fcos_d2"), Collect(logging.INFO)
    level, saved = logger.level, {name: os.environ.get(name) for name in variables}
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    os.environ.update(variables)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def predictor_in_process(paths: List[Path], overrides: List[str], cache: Path
                         ) -> Tuple[float, dict]:
    """(median seconds per image after one warm-up call, the parsed log) of
    DefaultPredictor(cfg) over ``paths`` in this process."""
    from detectron2.engine import DefaultPredictor

    lines: List[str] = []
    with fcos_d2_log(lines, cache_env(cache)):
        arrays = ep.read_arrays(paths)
        predictor = DefaultPredictor(ep.fcos_cfg(overrides))
        ep.timed_calls(predictor, arrays[:1])
        median = statistics.median(ep.timed_calls(predictor, arrays))
    return median, parse_log("\n".join(lines))
