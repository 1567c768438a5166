"""The FAD supernet head's cost with and without RepShare: parameters, peak RSS growth
and CPU time of one forward + backward (both towers, one search cell each, F = 256,
C = 96, 20 classes) on two levels of a small input (32x32 and 16x16), one thread.

    python tools/fad_supernet_memory.py on    # RepShare (MODEL.FAD.SEARCH.REPSHARE True)
    python tools/fad_supernet_memory.py off   # the ten candidates computed separately

Run each in its own process: the peak RSS is the process's. Prints one JSON line.
"""
import json
import resource
import sys
import time

import torch

import fcos_d2  # noqa: F401  (before detectron2: its compatibility shims)
from detectron2.layers import ShapeSpec

from fcos_d2.modeling.fad.supernet import FADSearchHead


def measure(repshare: bool) -> dict:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    levels = [ShapeSpec(channels=256, stride=8), ShapeSpec(channels=256, stride=16)]
    head = FADSearchHead(input_shape=levels, num_classes=20, box_channels=96, cls_channels=96,
                         repshare=repshare)
    features = [torch.randn(1, 256, 32, 32), torch.randn(1, 256, 16, 16)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    start = time.process_time()
    logits, regression, centerness = head(features)
    sum(x.sum() for x in logits + regression + centerness).backward()
    cpu = time.process_time() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"repshare": repshare, "parameters": sum(p.numel() for p in head.parameters()),
            "peak_rss_growth_mib": round((peak - before) / 1024, 1),
            "cpu_seconds": round(cpu, 3)}


if __name__ == "__main__":
    if sys.argv[1:] not in (["on"], ["off"]):
        sys.exit("usage: python tools/fad_supernet_memory.py on|off")
    print(json.dumps(measure(sys.argv[1] == "on")))
