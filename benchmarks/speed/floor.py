"""The arithmetic floor of a timed row: the model's FLOPs (fvcore's count of backbone + head,
one multiply-add = 2 FLOPs) divided by the best rate this machine reaches on the model's own
largest convolution, in the row's precision, timed in the same run (NCHW and channels_last,
the faster kept). A training iteration counts 3x the forward FLOPs (the backward computes
two products per forward one: gradients of inputs and of weights).

    floor_seconds = 2 * MACs * (3 if training else 1) / peak FLOP/s

Losses, post-processing and the optimizer step count nothing: the floor is what the
convolutions and matrix products alone would take at the rate of the largest one.
"""
from typing import Dict, List, Tuple

import torch
from torch import Tensor, nn

from benchmarks.speed import contenders as bc
from benchmarks.speed.timing import (backbone_head_macs, interleaved_medians, low_precision,
                                     low_tag)

TRAINING_FACTOR = 3  # forward + backward (input and weight gradients)


def conv_macs(conv: nn.Conv2d, output: Tensor) -> int:
    """Multiply-adds of one call of ``conv`` that gave ``output`` (N, Cout, H, W)."""
    kh, kw = conv.kernel_size
    return output.numel() * conv.in_channels // conv.groups * kh * kw


def largest_conv(contender: bc.Contender, images: Tensor) -> Tuple[nn.Conv2d, torch.Size]:
    """The convolution of the contender's backbone + head with the most multiply-adds in
    one call on ``images`` (N, 3, H, W), and the input shape of that call."""
    calls = []

    def record(module, inputs, output):
        calls.append((conv_macs(module, output), module, inputs[0].shape))

    hooks = [m.register_forward_hook(record) for m in contender.model.modules()
             if isinstance(m, nn.Conv2d)]
    try:
        with torch.no_grad():
            contender.backbone_head(images)
    finally:
        for hook in hooks:
            hook.remove()
    if not calls:
        raise ValueError(f"{contender.name}: no nn.Conv2d ran in its backbone and head; the "
                         "floor needs one to time")
    _, conv, shape = max(calls, key=lambda call: call[0])
    return conv, shape


def conv_floor(contender: bc.Contender, images: Tensor, device: str, dtype: torch.dtype,
               repeats: int) -> Dict[str, object]:
    """The best rate (FLOP/s) of a fresh copy of the contender's largest conv in ``dtype``
    on its own input shape: {"flops_per_second", "conv": its description}."""
    conv, shape = largest_conv(contender, images)
    fresh = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                      conv.padding, conv.dilation, conv.groups, conv.bias is not None)
    fresh = fresh.to(device=device, dtype=dtype).eval()
    nchw = torch.randn(shape, device=device, dtype=dtype)
    nhwc = nchw.contiguous(memory_format=torch.channels_last)
    fresh_nhwc = nn.Conv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                           conv.padding, conv.dilation, conv.groups, conv.bias is not None)
    fresh_nhwc = fresh_nhwc.to(device=device, dtype=dtype,
                               memory_format=torch.channels_last).eval()
    with torch.no_grad():
        macs = conv_macs(fresh, fresh(nchw))
        medians = interleaved_medians({"nchw": lambda: fresh(nchw),
                                       "nhwc": lambda: fresh_nhwc(nhwc)},
                                      max(repeats, 3), device)
    kh, kw = conv.kernel_size
    description = (f"{kh}x{kw} conv {conv.in_channels}->{conv.out_channels} stride "
                   f"{conv.stride[0]} on {tuple(shape)} {str(dtype).replace('torch.', '')}")
    return {"flops_per_second": 2 * macs / min(medians.values()), "conv": description}


def floor_seconds(macs: float, batch: int, flops_per_second: float, training: bool) -> float:
    """The floor of ``batch`` images of ``macs`` multiply-adds each at ``flops_per_second``."""
    return (TRAINING_FACTOR if training else 1) * 2 * macs * batch / flops_per_second


def inference_floor_seconds(contender: bc.Contender, images: Tensor,
                            flops_per_second: float) -> float:
    return 2 * backbone_head_macs(contender, images) / flops_per_second


def training_floor_seconds(contender: bc.Contender, images: Tensor,
                           flops_per_second: float) -> float:
    return TRAINING_FACTOR * inference_floor_seconds(contender, images, flops_per_second)


def attach_floors(results: List[dict], device: str, image_size: Tuple[int, int], repeats: int,
                  training: bool) -> None:
    """Adds to every timed result of an inference or training row of the R-50 FCOS its
    floor: "floor_seconds" (its batch, its precision: the low-precision tag in its name or
    fp32), "x_floor" (seconds over floor) and "floor_conv". The FLOPs are fcos-d2's
    backbone + head on one image (the three contenders run the same R-50, FPN and head
    convolutions), times the batch."""
    contender = bc.fcos_d2_contender(device)
    contender.model.eval()
    image = bc.random_images(1, *image_size, device)
    macs = backbone_head_macs(contender, image)
    tag = low_tag(device)
    peaks = {name: conv_floor(contender, image, device, dtype, repeats)
             for name, dtype in (("fp32", torch.float32), (tag, low_precision(device)))}
    for result in results:
        peak = peaks[tag if tag in result["contender"] else "fp32"]
        result["floor_seconds"] = floor_seconds(macs, result["batch"],
                                                peak["flops_per_second"], training)
        result["x_floor"] = result["seconds"] / result["floor_seconds"]
        result["floor_conv"] = peak["conv"]
