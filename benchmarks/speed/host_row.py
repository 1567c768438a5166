"""The host row of ``python -m benchmarks.speed`` (``--rows host``): one whole training
iteration (forward, losses, backward, SGD step; no loader) on inputs so small that the
arithmetic is a small part of it, so that what remains is each detector's host overhead per
iteration (Python, operator dispatch, allocations, synchronisations).

The three FCOS are built alike: ResNet-18 from scratch (trainable BN, nothing frozen), FPN
P3-P7 (P6/P7 from P5) of ``CHANNELS`` channels, a 4-conv GN head of the same width, 80
classes; 2 images of 64x96 with ``BOXES`` boxes each. The head is 32 channels wide rather
than 16: every contender's head uses GroupNorm with 32 groups (torchvision's FCOSHead and
detectron2's ``get_norm("GN")`` fix it), which needs a multiple of 32 channels.

Each result carries the row's arithmetic floor (``benchmarks.speed.floor``): the overhead
is the iteration's time less that floor (the issue's measure). Beside it, timed in the same
rounds, the backbone + head forward and backward alone ("network_seconds") and the rest of
the iteration ("rest_seconds": pre-processing, targets, losses, their backward, SGD step).
"""
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from benchmarks.speed import contenders as bc
from benchmarks.speed.floor import conv_floor, training_floor_seconds
from benchmarks.speed.timing import interleaved_medians, print_table, training_step

IMAGE_SIZE = (64, 96)  # (H, W)
BATCH = 2
BOXES = 4
CHANNELS = 32
# the issue's targets: fcos-d2's overhead over each other's
TARGETS = {"torchvision": 0.5, "detectron2": 0.7}


def fcos_d2_tiny(device: str) -> bc.Contender:
    """fcos-d2 as configs/FCOS-R50.yaml, on a ResNet-18 from scratch with a narrow FPN."""
    from detectron2.modeling import build_model

    cfg = bc.fcos_d2_cfg(device)
    cfg.MODEL.RESNETS.DEPTH, cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 18, 64
    cfg.MODEL.RESNETS.NORM, cfg.MODEL.BACKBONE.FREEZE_AT = "BN", 0
    cfg.MODEL.FPN.OUT_CHANNELS = CHANNELS
    return bc.detectron2_style("fcos-d2", build_model(cfg).to(device), bc.fcos_d2_optimizer(cfg))


def detectron2_tiny(device: str) -> Optional[bc.Contender]:
    """detectron2's built-in FCOS (its model zoo's fcos_R_50_FPN_1x) on the same ResNet-18;
    None where this detectron2 has no FCOS."""
    if not bc.detectron2_has_fcos():
        return None
    from detectron2 import model_zoo
    from detectron2.config import instantiate

    cfg = model_zoo.get_config("COCO-Detection/fcos_R_50_FPN_1x.py").model
    bottom_up = cfg.backbone.bottom_up
    bottom_up.stem.norm, bottom_up.stages.norm, bottom_up.freeze_at = "BN", "BN", 0
    bottom_up.stages.depth = 18
    del bottom_up.stages.stride_in_1x1  # bottleneck blocks only
    cfg.backbone.out_channels = CHANNELS
    cfg.backbone.top_block.in_channels = CHANNELS
    cfg.head.conv_dims = [CHANNELS] * 4
    cfg.head.input_shape = [bc.ShapeSpec(channels=CHANNELS)] * 5
    cfg.head.norm = bc.group_norm_32
    model = instantiate(cfg).to(device)
    return bc.detectron2_style(f"detectron2 {bc.detectron2_version()} FCOS", model)


def torchvision_tiny(device: str) -> bc.Contender:
    """torchvision's FCOS on its ResNet-18 from scratch (BN, every layer trained), resizing
    set to keep the images as they are."""
    from torchvision.models import resnet18
    from torchvision.models.detection import FCOS
    from torchvision.models.detection.backbone_utils import BackboneWithFPN
    from torchvision.ops.feature_pyramid_network import LastLevelP6P7

    # C3-C5 of ResNet-18 (64 * 2, 4, 8 channels), P6/P7 from P5 as the others
    backbone = BackboneWithFPN(resnet18(weights=None), {"layer2": "0", "layer3": "1",
                                                        "layer4": "2"}, [128, 256, 512],
                               CHANNELS, extra_blocks=LastLevelP6P7(CHANNELS, CHANNELS))
    model = FCOS(backbone, num_classes=bc.NUM_CLASSES, min_size=min(IMAGE_SIZE),
                 max_size=max(IMAGE_SIZE)).to(device)
    return bc.torchvision_style("torchvision", model)


def tensors_in(outputs) -> List[Tensor]:
    """The tensors of nested lists, tuples and dicts of head outputs."""
    if isinstance(outputs, Tensor):
        return [outputs]
    values = outputs.values() if isinstance(outputs, dict) else outputs
    return [t for value in values for t in tensors_in(value)]


def network_pass(contender: bc.Contender, images: Tensor) -> Callable[[], None]:
    """Backbone + head forward and backward alone (the gradients of a plain sum of the
    outputs): what a training iteration costs without pre-processing, targets, losses and
    the optimizer step."""
    def run():
        contender.model.zero_grad(set_to_none=True)
        sum(t.float().sum() for t in tensors_in(contender.backbone_head(images))).backward()
    return run


def contenders(device: str) -> Tuple[Dict[str, bc.Contender], Optional[str]]:
    """name -> contender, and why detectron2's FCOS is missing (None when it is there)."""
    built = {"fcos-d2": fcos_d2_tiny(device), "torchvision": torchvision_tiny(device)}
    d2 = detectron2_tiny(device)
    if d2 is None:
        return built, (f"detectron2 {bc.detectron2_version()} has no FCOS "
                       "(detectron2.modeling.meta_arch.fcos); its overhead is not measured")
    built["detectron2"] = d2
    return built, None


def row(args) -> List[dict]:
    """Times the three training iterations interleaved (``args.repeats`` after a warm-up of
    3, the allocator and autograd caches settling) and returns one result each."""
    torch.manual_seed(0)
    built, missing = contenders(args.device)
    images = bc.random_images(BATCH, *IMAGE_SIZE, args.device)
    targets = bc.random_targets(BATCH, BOXES, *IMAGE_SIZE, args.device)
    steps = {c.name: training_step(c, args.device, False) for c in built.values()}
    fns = {name: (lambda s=s: s(images, targets)) for name, s in steps.items()}
    fns.update({f"{c.name} network": network_pass(c, images) for c in built.values()})
    medians = interleaved_medians(fns, args.repeats, args.device, warmup=3)
    floor = conv_floor(built["fcos-d2"], images, args.device, torch.float32, args.repeats)
    results = []
    for contender in built.values():
        floor_seconds = training_floor_seconds(contender, images, floor["flops_per_second"])
        seconds = medians[contender.name]
        results.append({"row": "host", "contender": contender.name, "batch": BATCH,
                        "seconds": seconds, "image_size": list(IMAGE_SIZE), "boxes": BOXES,
                        "floor_seconds": floor_seconds, "overhead_seconds": seconds - floor_seconds,
                        "floor_conv": floor["conv"],
                        "network_seconds": medians[f"{contender.name} network"],
                        "rest_seconds": seconds - medians[f"{contender.name} network"]})
    if missing:
        print(f"\n[host] {missing}")
        results.append({"row": "host", "contender": "detectron2 FCOS", "missing": missing})
    print_table(f"host: training iteration, ResNet-18 from scratch, {CHANNELS}-channel head, "
                f"{BATCH} images of {'x'.join(map(str, IMAGE_SIZE))}",
                [r for r in results if "seconds" in r], "torchvision")
    for r in (r for r in results if "seconds" in r):
        print(f"  {r['contender']:32s} backbone + head forward and backward alone "
              f"{r['network_seconds'] * 1e3:7.1f} ms, the rest (pre-processing, targets, "
              f"losses, SGD step) {r['rest_seconds'] * 1e3:7.1f} ms")
    results[0]["targets"] = target_ratios(results)
    return results


def target_ratios(results: List[dict]) -> Dict[str, float]:
    """fcos-d2's overhead (iteration less floor) over each other contender's."""
    overhead = {r["contender"].split()[0]: r["overhead_seconds"] for r in results
                if "overhead_seconds" in r}
    return {f"host overhead per training iteration, fcos-d2 / {name} (target <= {limit})":
            overhead["fcos-d2"] / overhead[name]
            for name, limit in TARGETS.items() if name in overhead}
