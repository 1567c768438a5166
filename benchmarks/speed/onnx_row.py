"""The ONNX row of ``python -m benchmarks.speed``: the whole detector in onnxruntime (the graphs of
tools/export_onnx.py, float32 and --int8) against PyTorch eager (as configured: the fast
inference path), batch 1, the same thread count."""
import statistics
import tempfile
import time
from typing import Dict, Optional

import torch
from detectron2.modeling import build_model

from fcos_d2.export.files import export_onnx, onnxruntime_runner, pad_batch
from fcos_d2.export.int8 import quantize_int8
from fcos_d2.modeling.fast_inference import inference_model


def onnx_vs_eager_latency(cfg, height: int, width: int, threads: int, repeats: int,
                          class_bias: Optional[float] = -2.2,
                          int8: bool = True) -> Dict[str, float]:
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
        int8: also the int8 graph (fcos_d2.export.int8), calibrated on two random images.

    Returns:
        {"pytorch_eager": s, "onnxruntime": s, "detections": n} (n: PyTorch's count), and
        "onnxruntime_int8": s with ``int8``.
    """
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    if class_bias is not None:
        model.head.cls_logits.bias.data.fill_(class_bias)
    image = torch.rand(3, height, width) * 255
    batch, sizes = (x.numpy() for x in pad_batch([image]))
    model = inference_model(model)  # as exported: folded BN, channels_last
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        export_onnx(model, f"{folder}/fcos.onnx")
        run = onnxruntime_runner(f"{folder}/fcos.onnx", threads)
        runs = {"onnxruntime": lambda: run(batch, sizes),
                "pytorch_eager": lambda: model([{"image": image}])}
        if int8:  # calibrated on other random images of the same size
            calibration = [torch.rand(3, height, width, generator=torch.Generator().manual_seed(
                seed)) * 255 for seed in range(1, 3)]
            quantize_int8(f"{folder}/fcos.onnx", f"{folder}/int8.onnx",
                          [dict(zip(("images", "image_sizes"), (x.numpy() for x in pad_batch([c]))))
                           for c in calibration])
            run_int8 = onnxruntime_runner(f"{folder}/int8.onnx", threads)
            runs["onnxruntime_int8"] = lambda: run_int8(batch, sizes)
        # Interleaved, so that a change of load on a shared machine hits all alike.
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
