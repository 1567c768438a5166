"""The ONNX row of tools/benchmark.py: the whole detector in onnxruntime (the graph of
tools/export_onnx.py) against PyTorch eager, batch 1, the same thread count."""
import statistics
import tempfile
import time
from typing import Dict, Optional

import torch
from detectron2.modeling import build_model

from fcos_d2.export.files import export_onnx, onnxruntime_runner, pad_batch


def onnx_vs_eager_latency(cfg, height: int, width: int, threads: int, repeats: int,
                          class_bias: Optional[float] = -2.2) -> Dict[str, float]:
    """Median seconds per image (batch 1) of the whole detector: PyTorch eager
    (``FCOS.forward``, post-processing included) vs onnxruntime running the whole graph,
    both on the CPU with ``threads`` threads.

    Args:
        cfg: an FCOS config; its model is built with random weights (MODEL.WEIGHTS unread).
        height, width: the image size (a random image).
        threads: torch's and onnxruntime's intra-op threads.
        repeats: timed runs of each after one warm-up, interleaved; medians are reported.
        class_bias: if not None, the class logits' bias; -2.2 lets about 5% of the
            (location, class) pairs pass the 0.05 threshold (a busy image), so that top-k
            and NMS do real work.

    Returns:
        {"pytorch_eager": s, "onnxruntime": s, "detections": n} (n: PyTorch's count).
    """
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    if class_bias is not None:
        model.head.cls_logits.bias.data.fill_(class_bias)
    image = torch.rand(3, height, width) * 255
    batch, sizes = (x.numpy() for x in pad_batch([image]))
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        export_onnx(model, f"{folder}/fcos.onnx")
        run = onnxruntime_runner(f"{folder}/fcos.onnx", threads)
        # Interleaved, so that a change of load on a shared machine hits both alike.
        runs = {"onnxruntime": lambda: run(batch, sizes),
                "pytorch_eager": lambda: model([{"image": image}])}
        times = {name: [] for name in runs}
        for repeat in range(repeats + 1):  # the first round warms up
            for name, fn in runs.items():
                start = time.perf_counter()
                fn()
                if repeat:
                    times[name].append(time.perf_counter() - start)
        detections = len(model([{"image": image}])[0]["instances"])
    result = {name: statistics.median(values) for name, values in times.items()}
    return {**result, "detections": detections}
