"""A deformable convolution as bilinear sampling (``grid_sample``) then one matrix product:
the same function as ``torchvision.ops.deform_conv2d``, much faster on a CPU, whose
torchvision kernel (above all its backward) runs scalar loops.

Symbols: N images, C input channels, O output channels, G deform groups, g conv groups,
K = kh * kw kernel taps, H x W the input size, Ho x Wo the output size.

Offsets follow torchvision's layout: (N, G * K * 2, Ho, Wo), per group and tap (dy, dx);
masks (N, G * K, Ho, Wo). A sample outside the image reads zeros, bilinearly blended with
the pixels inside, as torchvision's kernel does.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.nn import functional as F


def tap_positions(kernel: Tuple[int, int], out_size: Tuple[int, int], stride: int,
                   padding: int, dilation: int, device) -> Tuple[Tensor, Tensor]:
    """Undeformed sampling rows and columns, each (K, Ho, Wo), in input pixels."""
    kh, kw = kernel
    ho, wo = out_size
    tap_y = torch.arange(kh, device=device).repeat_interleave(kw) * dilation  # (K,)
    tap_x = torch.arange(kw, device=device).repeat(kh) * dilation
    rows = torch.arange(ho, device=device) * stride - padding  # (Ho,)
    cols = torch.arange(wo, device=device) * stride - padding
    y = tap_y[:, None, None] + rows[None, :, None]  # (K, Ho, 1)
    x = tap_x[:, None, None] + cols[None, None, :]  # (K, 1, Wo)
    return y.expand(-1, ho, wo), x.expand(-1, ho, wo)


def sample_columns(x: Tensor, offset: Tensor, kernel: Tuple[int, int], *, stride: int = 1,
                   padding: int = 0, dilation: int = 1, mask: Optional[Tensor] = None
                   ) -> Tensor:
    """The deformed, masked im2col of ``x`` (N, C, H, W): (N, C, K, Ho, Wo)."""
    n, c, h, w = x.shape
    k = kernel[0] * kernel[1]
    ho, wo = offset.shape[-2:]
    groups = offset.shape[1] // (2 * k)
    if groups * 2 * k != offset.shape[1] or c % groups:
        raise ValueError(f"deformable conv: offset channels {offset.shape[1]} are not "
                         f"2 * {k} taps * deform groups dividing the {c} input channels")
    base_y, base_x = tap_positions(kernel, (ho, wo), stride, padding, dilation, x.device)
    offset = offset.view(n, groups, k, 2, ho, wo)  # (N, G, K, (dy, dx), Ho, Wo)
    y = base_y.to(offset.dtype) + offset[:, :, :, 0]  # (N, G, K, Ho, Wo) in pixels
    px = base_x.to(offset.dtype) + offset[:, :, :, 1]
    # grid_sample (align_corners False) reads pixel p at (2p + 1) / size - 1
    grid = torch.stack([(2 * px + 1) / w - 1, (2 * y + 1) / h - 1], dim=-1)
    grid = grid.view(n * groups, k * ho, wo, 2)  # (N*G, K*Ho, Wo, (x, y))
    columns = F.grid_sample(x.reshape(n * groups, c // groups, h, w), grid, mode="bilinear",
                            padding_mode="zeros", align_corners=False)
    columns = columns.view(n, groups, c // groups, k, ho, wo)  # (N, G, C/G, K, Ho, Wo)
    if mask is not None:
        columns = columns * mask.view(n, groups, 1, k, ho, wo)
    return columns.reshape(n, c, k, ho, wo)


def sampled_deform_conv2d(x: Tensor, offset: Tensor, weight: Tensor,
                          bias: Optional[Tensor] = None, *, stride: int = 1, padding: int = 0,
                          dilation: int = 1, mask: Optional[Tensor] = None) -> Tensor:
    """``torchvision.ops.deform_conv2d`` (square stride, padding and dilation) by sampling.

    Args:
        x: (N, C, H, W); offset: (N, 2 * G * K, Ho, Wo); weight: (O, C / g, kh, kw);
        bias: (O,) or None; mask: (N, G * K, Ho, Wo) or None (DCNv1).

    Returns:
        (N, O, Ho, Wo). The sampling runs in float32 (float64 for float64 inputs); under
        autocast the product runs in the autocast dtype, as a plain conv would.
    """
    out_channels, per_group, kh, kw = weight.shape
    groups = x.shape[1] // per_group
    dtype = torch.promote_types(x.dtype, torch.float32)
    with torch.autocast(x.device.type, enabled=False):
        columns = sample_columns(x.to(dtype), offset.to(dtype), (kh, kw), stride=stride,
                                 padding=padding, dilation=dilation,
                                 mask=None if mask is None else mask.to(dtype))
    n, _, k, ho, wo = columns.shape
    columns = columns.reshape(n, groups, per_group * k, ho * wo)  # (N, g, C/g * K, Ho*Wo)
    kernels = weight.reshape(groups, out_channels // groups, per_group * k)  # (g, O/g, C/g*K)
    if not torch.is_autocast_enabled(x.device.type):
        kernels = kernels.to(columns.dtype)
    out = torch.matmul(kernels, columns)  # (N, g, O/g, Ho*Wo)
    out = out.reshape(n, out_channels, ho, wo)
    if bias is not None:
        out = out + bias.to(out.dtype)[:, None, None]
    return out if torch.is_autocast_enabled(x.device.type) else out.to(x.dtype)
