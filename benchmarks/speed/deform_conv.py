"""``python -m benchmarks.speed.deform_conv``: the CPU deformable conv, the sampled path
(``fcos_d2.modeling.deform_sampling``, what ``DeformConv2d`` runs on the CPU) against
torchvision's ``deform_conv2d`` kernel and a plain 3x3 conv, forward + backward, one
thread; then one training iteration of the published NAS-FCOS graph with its 16
deformable convs (``configs/NAS-FCOS/quickstart_dcn.yaml``, 4 images of 128 px) on each
path. Prints medians in milliseconds and the CPU kind; writes no record (a few seconds)."""
import argparse
import statistics
import time
from typing import Callable, Dict, List, Optional

import torch
from torch.nn import functional as F
from torchvision.ops import deform_conv2d

from benchmarks.records import cpu_kind


def _median_ms(fn: Callable[[], None], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def op_times(size: int, channels: int, repeats: int) -> Dict[str, float]:
    """Forward + backward of one 3x3 DCNv2 (2 deform groups) on (2, C, size, size)."""
    from fcos_d2.modeling.deform_sampling import sampled_deform_conv2d

    torch.manual_seed(0)
    x = torch.randn(2, channels, size, size, requires_grad=True)
    offset = torch.randn(2, 36, size, size, requires_grad=True)
    mask = torch.rand(2, 18, size, size, requires_grad=True)
    weight = torch.randn(channels, channels, 3, 3, requires_grad=True)

    def run(fn):
        return lambda: fn().sum().backward()

    return {
        "torchvision": _median_ms(run(lambda: deform_conv2d(x, offset, weight, padding=1,
                                                            mask=mask)), repeats),
        "sampled": _median_ms(run(lambda: sampled_deform_conv2d(x, offset, weight, padding=1,
                                                                mask=mask)), repeats),
        "conv3x3": _median_ms(run(lambda: F.conv2d(x, weight, padding=1)), repeats),
    }


def model_iteration_times(repeats: int) -> Dict[str, float]:
    """One forward + backward of the quickstart DCN model on 4 random 128-px images with
    boxes, on each path (torchvision's patched into ``DeformConv2d`` for the comparison)."""
    from detectron2.config import get_cfg
    from detectron2.modeling import build_model
    from detectron2.structures import Boxes, Instances

    import fcos_d2
    from fcos_d2.modeling import layers

    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(fcos_d2.get_config_file("NAS-FCOS/quickstart_dcn.yaml"))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "SOLVER.AMP.ENABLED", False])
    torch.manual_seed(0)
    model = build_model(cfg).train()
    batch = []
    for _ in range(4):
        instances = Instances((128, 128))
        instances.gt_boxes = Boxes(torch.tensor([[10.0, 12.0, 60.0, 70.0]]))
        instances.gt_classes = torch.tensor([1])
        batch.append({"image": torch.rand(3, 128, 128) * 255, "instances": instances,
                      "height": 128, "width": 128})

    def step():
        sum(model(batch).values()).backward()

    from detectron2.utils.events import EventStorage

    sampled = layers.sampled_deform_conv2d
    times = {}
    with EventStorage():
        times["sampled"] = _median_ms(step, repeats)
        layers.sampled_deform_conv2d = lambda x, o, w, b, **k: deform_conv2d(x, o, w, b, **k)
        try:
            times["torchvision"] = _median_ms(step, repeats)
        finally:
            layers.sampled_deform_conv2d = sampled
    return times


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_kind()}; threads {args.threads}; median ms of {args.repeats}")
    for size in (16, 32):
        t = op_times(size, 64, args.repeats)
        print(f"DCNv2 3x3, (2, 64, {size}, {size}), fwd+bwd: torchvision {t['torchvision']:.1f}, "
              f"sampled {t['sampled']:.1f} ({t['torchvision'] / t['sampled']:.1f}x faster), "
              f"plain conv {t['conv3x3']:.1f}")
    t = model_iteration_times(args.repeats)
    print(f"quickstart_dcn.yaml iteration (4 x 128 px, fwd+bwd): torchvision "
          f"{t['torchvision']:.0f}, sampled {t['sampled']:.0f} "
          f"({t['torchvision'] / t['sampled']:.1f}x faster)")


if __name__ == "__main__":
    main()
