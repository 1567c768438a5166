"""detectron2's ``DefaultPredictor(cfg)`` on R-50 FCOS (configs/FCOS-R50.yaml) for the entry
row (``entry_row``): the overrides it and the row's ``--eval-only`` command share, its timed
calls, and the fresh process that times a first call against the calls after it:

    python -m benchmarks.speed.entry_predictor WEIGHTS CACHE_DIR HxW IMAGE [IMAGE ...]

prints fcos_d2's log (the "INFERENCE_BACKEND auto" line, a compile's lines), then one line
``entry-predictor {"build_s": ..., "first_s": ..., "steady_s": ...}``: the seconds of
``DefaultPredictor(cfg)``, of its first call and the median of the ``--calls`` after it.
The threads are torch's default (the row sets ``OMP_NUM_THREADS``).
"""
import argparse
import json
import statistics
import sys
import time
from typing import List, Optional, Sequence, Tuple

import fcos_d2  # noqa: F401  (first: detectron2 v0.6 shims; registers FCOS)
from detectron2.config import CfgNode, get_cfg

from benchmarks.speed.contenders import REPO
from fcos_d2.config import add_fcos_config

CONFIG = REPO / "configs" / "FCOS-R50.yaml"
MARK = "entry-predictor "  # the result line's start


def fcos_cfg(overrides: Sequence[str] = ()) -> CfgNode:
    """configs/FCOS-R50.yaml with ``overrides`` (KEY VALUE ...), as train_net.py reads it."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(CONFIG))
    cfg.merge_from_list(list(overrides))
    return cfg


def size_overrides(cfg: CfgNode, height: int, width: int) -> List[str]:
    """INPUT.MIN/MAX_SIZE_TEST that keep ``height`` x ``width`` as it is, where ``cfg``'s
    test resize would change it; [] where it keeps it (800x1216 under 800/1333)."""
    short, long = min(height, width), max(height, width)
    if cfg.INPUT.MIN_SIZE_TEST == short and long <= cfg.INPUT.MAX_SIZE_TEST:
        return []
    return ["INPUT.MIN_SIZE_TEST", str(short), "INPUT.MAX_SIZE_TEST", str(long)]


def shared_overrides(weights: str, cache_dir: str, size: Tuple[int, int]) -> List[str]:
    """The overrides of the row's every run: the checkpoint, the CPU, the compile cache
    folder, the images kept at their size; the backend stays the config's (auto)."""
    return ["MODEL.WEIGHTS", weights, "MODEL.DEVICE", "cpu", "MODEL.FCOS.COMPILE_CACHE_DIR",
            cache_dir, *size_overrides(fcos_cfg(), *size)]


def timed_calls(predictor, arrays: Sequence) -> List[float]:
    """Seconds of ``predictor(array)`` for each of ``arrays``, in turn."""
    seconds = []
    for array in arrays:
        start = time.perf_counter()
        predictor(array)
        seconds.append(time.perf_counter() - start)
    return seconds


def read_arrays(paths: Sequence[str]) -> list:
    """(H, W, 3) uint8 BGR arrays, as DefaultPredictor takes them."""
    from detectron2.data.detection_utils import read_image

    return [read_image(str(path), format="BGR") for path in paths]


def main(argv: Optional[List[str]] = None) -> None:
    from detectron2.engine import DefaultPredictor
    from detectron2.utils.logger import setup_logger

    parser = argparse.ArgumentParser(prog="python -m benchmarks.speed.entry_predictor")
    parser.add_argument("weights")
    parser.add_argument("cache_dir")
    parser.add_argument("size", help="HxW of the images")
    parser.add_argument("images", nargs="+")
    parser.add_argument("--calls", type=int, default=5, help="calls after the first")
    args = parser.parse_args(argv)
    setup_logger(name="fcos_d2")  # INFO to stdout: what auto chose, a compile's lines
    size = tuple(int(x) for x in args.size.split("x"))
    arrays = read_arrays(args.images)
    start = time.perf_counter()
    predictor = DefaultPredictor(fcos_cfg(shared_overrides(args.weights, args.cache_dir, size)))
    build = time.perf_counter() - start
    seconds = timed_calls(predictor, [arrays[i % len(arrays)] for i in range(args.calls + 1)])
    print(MARK + json.dumps({"build_s": build, "first_s": seconds[0],
                             "steady_s": statistics.median(seconds[1:])}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
