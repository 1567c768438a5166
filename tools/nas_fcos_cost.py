"""Parameters, GFLOPs (fvcore: one multiply-add counts as one flop, as detectron2 reports)
and CPU latency per image of detectors built from configs, side by side (random weights:
cost does not depend on them).

    python tools/nas_fcos_cost.py configs/quickstart.yaml configs/NAS-FCOS/quickstart.yaml

Latency: the median of ``--runs`` single-image inferences at INPUT.MIN_SIZE_TEST, after
two warm-up runs, on ``--threads`` threads, float32 (MODEL.FCOS.INFERENCE_DTYPE as set).
"""
import argparse
import platform
import statistics
import time

import torch

import fcos_d2  # first: detectron2 without its C++ extension
from detectron2.config import get_cfg  # noqa: E402
from detectron2.modeling import build_model  # noqa: E402
from fvcore.nn import FlopCountAnalysis  # noqa: E402


def cpu_kind() -> str:
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    return names[0] if names else platform.processor()


def measure(config: str, runs: int) -> dict:
    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(config)
    cfg.MODEL.DEVICE = "cpu"
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    size = cfg.INPUT.MIN_SIZE_TEST
    inputs = [{"image": torch.rand(3, size, size) * 255}]
    with torch.no_grad():
        images = model.preprocess_image(inputs)
        flops = FlopCountAnalysis(model.backbone, images.tensor)
        flops.unsupported_ops_warnings(False)
        features = model.backbone(images.tensor)
        head_flops = FlopCountAnalysis(model.head, ([features[f] for f in
                                                     model.head_in_features],))
        head_flops.unsupported_ops_warnings(False)
        times = []
        for run in range(runs + 2):
            start = time.perf_counter()
            model(inputs)
            times.append(time.perf_counter() - start)
    return {"config": config, "params_M": sum(p.numel() for p in model.parameters()) / 1e6,
            "gflops": (flops.total() + head_flops.total()) / 1e9,
            "latency_ms": 1000 * statistics.median(times[2:]), "size": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_kind()}, {args.threads} thread(s), torch {torch.__version__}")
    print("| config | params (M) | GFLOPs | CPU latency (ms/image) |")
    print("| --- | --- | --- | --- |")
    for config in args.configs:
        r = measure(config, args.runs)
        print(f"| {r['config']} ({r['size']} px) | {r['params_M']:.2f} | {r['gflops']:.3f} | "
              f"{r['latency_ms']:.1f} |")


if __name__ == "__main__":
    main()
