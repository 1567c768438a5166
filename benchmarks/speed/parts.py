"""Part-level rows of ``python -m benchmarks.speed`` (``--rows parts``), each against
torchvision on the same inputs:

1. training targets + losses for a COCO-like batch (16 images of 800x1333, 50 boxes each,
   80 classes; 4 with --quick): fcos-d2 vs torchvision's FCOS ``compute_loss`` on the same
   head outputs;
2. post-processing of an R-50 FCOS's outputs at 800x1216: its share of the time of
   backbone + head (goal: under 10%), and fcos-d2's vs torchvision's
   ``postprocess_detections`` on the same head outputs.
"""
import statistics
import time
from pathlib import Path
from typing import Callable, List

import torch

import fcos_d2  # noqa: F401  (before detectron2)
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from torchvision.models.detection import FCOS as TorchvisionFCOS
from torchvision.models.detection.image_list import ImageList

from fcos_d2.modeling.assignment import assign_targets, compute_locations, level_size_ranges
from fcos_d2.modeling.losses import fcos_losses

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


def bench_training_targets(repeats: int, num_images: int) -> dict:
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
    print(f"\n[parts: targets+losses] {num_images} images of {height}x{width}, 50 boxes, "
          f"{NUM_CLASSES} classes, {num_locations} locations/image")
    print(f"  fcos-d2      {t_ours * 1e3:8.1f} ms")
    print(f"  torchvision  {t_theirs * 1e3:8.1f} ms   -> fcos-d2 is {t_theirs / t_ours:.2f}x as fast")
    return {"row": "parts", "part": "targets+losses", "images": num_images,
            "fcos_d2_seconds": t_ours, "torchvision_seconds": t_theirs}


def r50_fcos(score_thresh: float):
    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(str(Path(__file__).resolve().parents[2] / "configs" / "FCOS-R50.yaml"))
    cfg.MODEL.DEVICE, cfg.MODEL.WEIGHTS = "cpu", ""
    cfg.MODEL.FCOS.INFERENCE_TH_TEST = score_thresh
    return build_model(cfg).eval()


def bench_postprocess(repeats: int) -> dict:
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
    print(f"\n[parts: post-processing] R-50 FCOS, one {height}x{width} image, {candidates} candidates above 0.05")
    print(f"  backbone+head          {t_net * 1e3:8.1f} ms")
    print(f"  post-processing        {t_post * 1e3:8.1f} ms   -> {100 * t_post / t_net:.1f}% of "
          f"backbone+head (goal < 10%)")
    print(f"  torchvision post-proc. {t_tv * 1e3:8.1f} ms   -> fcos-d2 is {t_tv / t_post:.2f}x as fast")
    return {"row": "parts", "part": "post-processing", "candidates": candidates,
            "backbone_head_seconds": t_net, "fcos_d2_seconds": t_post,
            "torchvision_seconds": t_tv}


def run(repeats: int, quick: bool) -> List[dict]:
    return [bench_training_targets(repeats, num_images=4 if quick else 16),
            bench_postprocess(repeats)]
