"""Side-by-side CPU benchmarks of fcos-d2 (ratios are measured in the same run).

1. Training targets + losses for a COCO-like batch (16 images of 800x1333, 50 boxes each,
   80 classes): fcos-d2 vs torchvision's FCOS ``compute_loss`` on the same head outputs.
2. Inference at 800x1216 with an R-50 FCOS: the share of post-processing in the time of
   backbone + head (goal: under 10%), and fcos-d2's post-processing vs torchvision's
   ``postprocess_detections`` on the same head outputs.

3. With --onnx (only): the whole detector at 800x1216, R-50, batch 1: onnxruntime running
   the exported graph vs PyTorch eager, same thread count (``onnx_vs_eager_latency``).

Usage: python tools/benchmark.py [--repeats 3] [--quick] | [--onnx --threads 1]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import fcos_d2  # noqa: E402,F401  (before detectron2)
from detectron2.config import get_cfg  # noqa: E402
from detectron2.modeling import build_model  # noqa: E402
from torchvision.models.detection import FCOS as TorchvisionFCOS  # noqa: E402
from torchvision.models.detection.image_list import ImageList  # noqa: E402

from fcos_d2.modeling.assignment import assign_targets, compute_locations, level_size_ranges  # noqa: E402
from fcos_d2.modeling.losses import fcos_losses  # noqa: E402

STRIDES = [8, 16, 32, 64, 128]
NUM_CLASSES = 80


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def level_shapes(height: int, width: int) -> List[tuple]:
    height, width = -(-height // 32) * 32, -(-width // 32) * 32  # padded like the model
    return [(-(-height // s), -(-width // s)) for s in STRIDES]


def random_boxes(num: int, height: int, width: int, generator: torch.Generator) -> torch.Tensor:
    xy = torch.rand(num, 2, generator=generator) * torch.tensor([width * 0.8, height * 0.8])
    wh = 8 + torch.rand(num, 2, generator=generator) * torch.tensor([width * 0.5, height * 0.5])
    return torch.cat([xy, torch.minimum(xy + wh, torch.tensor([width - 1.0, height - 1.0]))], 1)


def torchvision_fcos() -> TorchvisionFCOS:
    backbone = torch.nn.Identity()
    backbone.out_channels = 256
    return TorchvisionFCOS(backbone, NUM_CLASSES, score_thresh=0.05, nms_thresh=0.6,
                           detections_per_img=100, topk_candidates=1000)


def bench_training_targets(repeats: int, num_images: int) -> None:
    generator = torch.Generator().manual_seed(0)
    height, width = 800, 1333
    shapes = level_shapes(height, width)
    locations = compute_locations(shapes, STRIDES, torch.device("cpu"))
    num_locations = sum(h * w for h, w in shapes)
    boxes = [random_boxes(50, height, width, generator) for _ in range(num_images)]
    classes = [torch.randint(0, NUM_CLASSES, (50,), generator=generator) for _ in range(num_images)]
    logits = torch.randn(num_images, num_locations, NUM_CLASSES, generator=generator)
    reg = torch.rand(num_images, num_locations, 4, generator=generator) * 4
    ctr = torch.randn(num_images, num_locations, generator=generator)

    def ours():
        labels, targets = assign_targets(
            locations, boxes, classes, strides=STRIDES, size_ranges=level_size_ranges([64, 128, 256, 512]),
            center_sampling_radius=1.5, num_classes=NUM_CLASSES, norm_reg_targets=True)
        return fcos_losses(logits=logits, reg_pred=reg, ctr_logits=ctr, labels=labels,
                           reg_targets=targets, num_classes=NUM_CLASSES, focal_alpha=0.25,
                           focal_gamma=2.0, loc_loss_type="giou")

    model = torchvision_fcos()
    images = ImageList(torch.zeros(num_images, 3, *[s * 8 for s in shapes[0]]),
                       [(height, width)] * num_images)
    features = [torch.zeros(num_images, 1, h, w) for h, w in shapes]
    anchors = model.anchor_generator(images, features)
    head_outputs = {"cls_logits": logits, "bbox_regression": reg, "bbox_ctrness": ctr[..., None]}
    targets = [{"boxes": b, "labels": c} for b, c in zip(boxes, classes)]

    def theirs():
        return model.compute_loss(targets, head_outputs, anchors, [h * w for h, w in shapes])

    t_ours, t_theirs = median_seconds(ours, repeats), median_seconds(theirs, repeats)
    print(f"[targets+losses] {num_images} images of {height}x{width}, 50 boxes, "
          f"{NUM_CLASSES} classes, {num_locations} locations/image")
    print(f"  fcos-d2      {t_ours * 1e3:8.1f} ms")
    print(f"  torchvision  {t_theirs * 1e3:8.1f} ms   -> fcos-d2 is {t_theirs / t_ours:.2f}x as fast")


def r50_fcos(score_thresh: float):
    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(str(Path(__file__).resolve().parents[1] / "configs" / "FCOS-R50.yaml"))
    cfg.MODEL.DEVICE, cfg.MODEL.WEIGHTS = "cpu", ""
    cfg.MODEL.FCOS.INFERENCE_TH_TEST = score_thresh
    return build_model(cfg).eval()


def bench_inference(repeats: int) -> None:
    height, width = 800, 1216
    torch.manual_seed(0)
    model = r50_fcos(score_thresh=0.05)
    # Random weights score every class near the prior (0.01); lift the class bias so that
    # about 5% of (location, class) pairs pass the threshold, a busy-image workload.
    model.head.cls_logits.bias.data.fill_(-2.2)
    inputs = [{"image": torch.rand(3, height, width) * 255}]
    with torch.no_grad():
        images = model.preprocess_image(inputs)
        t_net = median_seconds(lambda: model.forward_head(images), repeats)
        logits, reg, ctr = model.forward_head(images)
        locations = compute_locations([x.shape[-2:] for x in logits], model.strides, model.device)

        def ours():
            return model.inference(locations, images.image_sizes, logits, reg, ctr)

        t_post = median_seconds(ours, repeats)
        candidates = sum(int((x.sigmoid() > 0.05).sum()) for x in logits)
        tv = torchvision_fcos()
        pixels = model.regression_in_pixels(reg)
        split = {"cls_logits": [x.flatten(2).transpose(1, 2) for x in logits],
                 "bbox_regression": [x.flatten(2).transpose(1, 2) for x in pixels],
                 "bbox_ctrness": [x.flatten(2).transpose(1, 2) for x in ctr]}
        # torchvision decodes from stride-sized anchors; the amount of work is the same.
        anchors = [[torch.cat([loc - s / 2, loc + s / 2], dim=1)
                    for loc, s in zip(locations, model.strides)]]
        t_tv = median_seconds(lambda: tv.postprocess_detections(split, anchors, images.image_sizes),
                              repeats)
    print(f"[inference] R-50 FCOS, one {height}x{width} image, {candidates} candidates above 0.05")
    print(f"  backbone+head          {t_net * 1e3:8.1f} ms")
    print(f"  post-processing        {t_post * 1e3:8.1f} ms   -> {100 * t_post / t_net:.1f}% of "
          f"backbone+head (goal < 10%)")
    print(f"  torchvision post-proc. {t_tv * 1e3:8.1f} ms   -> fcos-d2 is {t_tv / t_post:.2f}x as fast")


def onnx_vs_eager_latency(cfg, height: int, width: int, threads: int, repeats: int,
                          class_bias: Optional[float] = -2.2) -> Dict[str, float]:
    """Median seconds per image (batch 1) of the whole detector: PyTorch eager
    (``FCOS.forward``, post-processing included) vs onnxruntime running the whole graph of
    ``tools/export_onnx.py``, both on the CPU with ``threads`` threads.

    Args:
        cfg: an FCOS config; its model is built with random weights (MODEL.WEIGHTS unread).
        height, width: the image size (a random image).
        threads: torch's and onnxruntime's intra-op threads.
        repeats: timed runs of each after one warm-up, interleaved; medians are reported.
        class_bias: if not None, the class logits' bias; -2.2 lets about 5% of the
            (location, class) pairs pass the 0.05 threshold (a busy image, as
            ``bench_inference``), so that top-k and NMS do real work.

    Returns:
        {"pytorch_eager": s, "onnxruntime": s, "detections": n} (n: PyTorch's count).
    """
    import tempfile

    from fcos_d2.export.files import export_onnx, onnxruntime_runner, pad_batch

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


def bench_onnx(repeats: int, threads: int) -> None:
    height, width = 800, 1216
    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(str(Path(__file__).resolve().parents[1] / "configs" / "FCOS-R50.yaml"))
    cfg.MODEL.DEVICE, cfg.MODEL.WEIGHTS = "cpu", ""
    result = onnx_vs_eager_latency(cfg, height, width, threads, repeats)
    print(f"[whole detector] R-50 FCOS, one {height}x{width} image, batch 1, {threads} threads, "
          f"{result['detections']} detections, median of {repeats}")
    print(f"  PyTorch eager          {result['pytorch_eager'] * 1e3:8.1f} ms")
    print(f"  onnxruntime            {result['onnxruntime'] * 1e3:8.1f} ms   -> "
          f"{result['pytorch_eager'] / result['onnxruntime']:.2f}x as fast as eager")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4 images instead of 16")
    parser.add_argument("--onnx", action="store_true",
                        help="only the whole detector: onnxruntime vs PyTorch eager")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="--onnx: threads of both runtimes")
    args = parser.parse_args()
    if args.onnx:
        import onnxruntime

        print(f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}")
        bench_onnx(args.repeats, args.threads)
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    bench_training_targets(args.repeats, num_images=4 if args.quick else 16)
    bench_inference(args.repeats)


if __name__ == "__main__":
    main()
