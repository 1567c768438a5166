"""FPN levels and ``SIZES_OF_INTEREST`` chosen from a dataset's box sizes.

The rule keeps FCOS's own geometry and fits only its scale to the data:

- the finest level is the coarsest stride at which the small objects (the
  ``small_quantile`` of the longer sides) still span ``min_cells`` strides, so that their
  center region holds several locations, but never finer than the finest level available
  (P2, stride 4);
- a level takes the objects whose largest location-to-side distance is at most
  ``range_factor`` of its strides (the official ranges are 8 strides, ``[64, 128, ...]``
  from P3; the small-data recipe's 4, ``[32, 64, ...]``), the last level everything above;
- levels are added upward until one holds the largest objects (the ``large_quantile`` of
  the longer sides, whose distance from the center is half the side): higher levels would
  see background only.
"""
from typing import Dict, List, Sequence, Tuple

import numpy as np

from .level_fit import LEVEL_STRIDES


def choose_levels(sides: Sequence[float], *, available: Dict[str, int] = LEVEL_STRIDES,
                  range_factor: float = 4.0, min_cells: float = 2.0,
                  small_quantile: float = 0.1, large_quantile: float = 0.99
                  ) -> Tuple[List[str], List[float]]:
    """Levels and ranges for objects whose longer sides (px, after the resize) are `sides`.

    Args:
        sides: (B,) longer sides; at least one.
        available: level name -> stride, the levels the backbone can give.
        range_factor: a level's upper range in its strides.
        min_cells: strides the small objects should span on the finest level.
        small_quantile, large_quantile: which sides count as "the small" and "the largest".

    Returns:
        (level names finest first, e.g. ["p2", "p3", "p4"]; their SIZES_OF_INTEREST, one
        fewer).
    """
    sides = np.asarray(sides, dtype=np.float64)
    if sides.size == 0:
        raise ValueError("choose_levels: no boxes to choose levels from")
    ordered = sorted(available.items(), key=lambda item: item[1])  # finest first
    small = float(np.quantile(sides, small_quantile))
    largest_distance = float(np.quantile(sides, large_quantile)) / 2
    fitting = [i for i, (_, stride) in enumerate(ordered) if stride * min_cells <= small]
    first = fitting[-1] if fitting else 0
    chosen = [ordered[first]]
    while range_factor * chosen[-1][1] < largest_distance and first + len(chosen) < len(ordered):
        chosen.append(ordered[first + len(chosen)])
    levels = [name for name, _ in chosen]
    sizes = [float(range_factor * stride) for _, stride in chosen[:-1]]
    return levels, sizes
