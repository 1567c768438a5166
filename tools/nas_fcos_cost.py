"""Parameters, GFLOPs (fvcore: one multiply-add counts as one flop, as detectron2 reports)
and CPU latency per image of detectors built from configs, side by side (random weights:
cost does not depend on them).

    python tools/nas_fcos_cost.py configs/quickstart.yaml configs/NAS-FCOS/quickstart.yaml

Latency: the median of ``--runs`` single-image inferences at INPUT.MIN_SIZE_TEST, after
two warm-up runs, on ``--threads`` threads, float32 (MODEL.FCOS.INFERENCE_DTYPE as set).
Training: the median of 3 forward+backward passes (after one warm-up) of ``--train-batch``
images with two boxes each, under bf16 autocast when SOLVER.AMP.ENABLED.
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


def training_seconds(model, cfg, batch: int) -> float:
    from detectron2.structures import Boxes, Instances
    from detectron2.utils.events import EventStorage

    size = cfg.INPUT.MIN_SIZE_TEST
    inputs = []
    for _ in range(batch):
        instances = Instances((size, size))
        instances.gt_boxes = Boxes(torch.tensor([[10.0, 10.0, 60.0, 50.0],
                                                 [70.0, 80.0, 120.0, 125.0]]) * size / 128)
        instances.gt_classes = torch.tensor([0, 1])
        inputs.append({"image": torch.rand(3, size, size) * 255, "instances": instances})
    model.train()
    times = []
    with EventStorage(), torch.autocast("cpu", dtype=torch.bfloat16,
                                        enabled=cfg.SOLVER.AMP.ENABLED):
        for _ in range(4):
            start = time.perf_counter()
            sum(model(inputs).values()).backward()
            times.append(time.perf_counter() - start)
    model.eval()
    return statistics.median(times[1:])


def measure(config: str, runs: int, train_batch: int) -> dict:
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
    train = training_seconds(model, cfg, train_batch) if train_batch else float("nan")
    return {"config": config, "params_M": sum(p.numel() for p in model.parameters()) / 1e6,
            "gflops": (flops.total() + head_flops.total()) / 1e9,
            "latency_ms": 1000 * statistics.median(times[2:]), "size": size, "train_s": train}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--train-batch", type=int, default=0,
                        help="also time a training iteration of this many images (0: no)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_kind()}, {args.threads} thread(s), torch {torch.__version__}")
    print("| config | params (M) | GFLOPs | CPU latency (ms/image) | training iteration (s) |")
    print("| --- | --- | --- | --- | --- |")
    for config in args.configs:
        r = measure(config, args.runs, args.train_batch)
        print(f"| {r['config']} ({r['size']} px) | {r['params_M']:.2f} | {r['gflops']:.3f} | "
              f"{r['latency_ms']:.1f} | {r['train_s']:.2f} |")


if __name__ == "__main__":
    main()
