"""The adapter and the feature distance of LabelEnc (step 1's distance loss, step 2's
auxiliary loss).

Symbols: N images, C channels, L levels, Hi x Wi the size of level i.

Both losses compare the detector's features, passed through a small adapter (3x3 conv,
ReLU, 3x3 conv, ReLU, 3x3 conv, shared by the levels), with the LEF's: each level of each
image is layer-normalized (over C, Hi, Wi, no affine), and the squared differences of all
levels are averaged together, so that a level counts by its number of elements. The
adapter exists only in training.
"""
from typing import List

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def make_adapter(channels: int) -> nn.Sequential:
    """The training-only adapter: three 3x3 convs (C -> C) with ReLUs between them."""
    return nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(channels, channels, 3, padding=1))


def feature_distance(features: List[Tensor], targets: List[Tensor]) -> Tensor:
    """Mean squared difference of the layer-normalized ``features`` and ``targets`` (per
    level (N, C, Hi, Wi), the same shapes) over all elements of all levels; computed in
    float32. Gradients flow into both: detach the targets to keep them fixed."""
    with torch.autocast(features[0].device.type, enabled=False):
        total = features[0].new_zeros((), dtype=torch.float32)
        count = 0
        for feature, target in zip(features, targets):
            if feature.shape != target.shape:
                raise ValueError(f"LabelEnc: detector features {tuple(feature.shape)} and "
                                 f"LEF features {tuple(target.shape)} differ in shape")
            difference = F.group_norm(feature.float(), 1) - F.group_norm(target.float(), 1)
            total = total + difference.pow(2).sum()
            count += difference.numel()
        return total / count


def touch(module: nn.Module) -> Tensor:
    """0 * the sum of ``module``'s parameters: a zero loss that keeps them in the graph, so
    that DistributedDataParallel finds every parameter used when a loss is switched off."""
    return sum(p.sum() for p in module.parameters() if p.requires_grad) * 0.0
