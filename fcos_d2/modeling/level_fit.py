"""How a config's FPN levels fit a dataset's boxes: the fit table and the levels chosen
from the data. Pure functions over boxes already resized as the model will see them.

FCOS puts an object on the level whose regression range holds its largest distance from a
location to a box side (about half the box's longer side near its center), and trains only
the locations of that level that lie in the box's center region. An object of 10 px on a
stride-8 level gets one or two such locations; on stride 4, four. The table says, per
object size, which level the objects land on and how many positive locations each gets,
so that a user sees before training what the config can learn (YOLOv5's AutoAnchor check,
for levels).

Symbols: B objects in all, L levels of the config, M boxes of one image.
"""
import math
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

from .assignment import assign_targets_with_matches, compute_locations, level_size_ranges

# Object sizes by the box's longer side after the resize, px: (name, low, high).
SIZE_BINS: Tuple[Tuple[str, float, float], ...] = (
    ("< 16", 0.0, 16.0), ("16-32", 16.0, 32.0), ("32-64", 32.0, 64.0),
    ("64-128", 64.0, 128.0), (">= 128", 128.0, math.inf))
NO_LEVEL = "none"
# Strides of the FPN levels fcos-d2's backbones can give, by level name (P2 from res2).
LEVEL_STRIDES: Dict[str, int] = {f"p{i}": 2 ** i for i in range(2, 8)}


@dataclass
class ImageBoxes:
    """One image as the model sees it: its (height, width) after the resize and its boxes
    (M, 4) XYXY in those pixels."""

    height: int
    width: int
    boxes: np.ndarray


@dataclass
class LevelFit:
    """Per object (B,): its longer side (px), its positives per level (B, L), and the
    config it was measured with."""

    levels: List[str]
    sides: np.ndarray
    positives: np.ndarray
    strides: List[int] = field(default_factory=list)
    sizes_of_interest: List[float] = field(default_factory=list)
    center_sampling_radius: float = 0.0

    def landing_level(self) -> np.ndarray:
        """(B,) the index of the level holding most of each object's positives, -1 for
        an object with none."""
        if self.positives.size == 0:
            return np.zeros(0, dtype=np.int64)
        best = self.positives.argmax(axis=1)
        return np.where(self.positives.sum(axis=1) > 0, best, -1)


def padded_shape(height: int, width: int, divisibility: int) -> Tuple[int, int]:
    """The input's size after detectron2's ImageList pads it to a multiple of
    `divisibility` (the backbone's ``size_divisibility``; 0 or 1: unpadded)."""
    if divisibility <= 1:
        return height, width
    return (int(math.ceil(height / divisibility) * divisibility),
            int(math.ceil(width / divisibility) * divisibility))


def image_positives(image: ImageBoxes, *, strides: Sequence[int],
                    sizes_of_interest: Sequence[float], center_sampling_radius: float,
                    size_divisibility: int = 0) -> np.ndarray:
    """(M, L) positives of each box of `image` on each level, from the project's own
    assignment (``assign_targets_with_matches``)."""
    boxes = torch.as_tensor(np.asarray(image.boxes, dtype=np.float32)).reshape(-1, 4)
    height, width = padded_shape(image.height, image.width, size_divisibility)
    shapes = [(int(math.ceil(height / s)), int(math.ceil(width / s))) for s in strides]
    locations = compute_locations(shapes, strides, torch.device("cpu"))
    _, _, matched = assign_targets_with_matches(
        locations, [boxes], [torch.zeros(len(boxes), dtype=torch.int64)], strides=strides,
        size_ranges=level_size_ranges(sizes_of_interest),
        center_sampling_radius=center_sampling_radius, num_classes=1, norm_reg_targets=False)
    counts = np.zeros((len(boxes), len(strides)), dtype=np.int64)
    start = 0
    for level, points in enumerate(locations):
        hits = matched[0, start:start + len(points)]  # (Hi * Wi,)
        hits = hits[hits >= 0].numpy()
        np.add.at(counts[:, level], hits, 1)
        start += len(points)
    return counts


def measure_fit(images: Sequence[ImageBoxes], *, levels: Sequence[str], strides: Sequence[int],
                sizes_of_interest: Sequence[float], center_sampling_radius: float,
                size_divisibility: int = 0) -> LevelFit:
    """The fit of a config's levels to `images` (see :class:`LevelFit`)."""
    sides, positives = [np.zeros(0)], [np.zeros((0, len(strides)), dtype=np.int64)]
    for image in images:
        boxes = np.asarray(image.boxes, dtype=np.float64).reshape(-1, 4)
        if len(boxes) == 0:
            continue
        sides.append(np.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]))
        positives.append(image_positives(
            image, strides=strides, sizes_of_interest=sizes_of_interest,
            center_sampling_radius=center_sampling_radius, size_divisibility=size_divisibility))
    return LevelFit(list(levels), np.concatenate(sides), np.concatenate(positives),
                    list(strides), [float(s) for s in sizes_of_interest],
                    float(center_sampling_radius))


def bin_rows(fit: LevelFit) -> List[dict]:
    """One row per size bin with objects, and one for all: {"bin", "objects", "levels":
    {level or "none": share}, "median_positives", "none": share, "one": share}."""
    landing, total = fit.landing_level(), fit.positives.sum(axis=1)
    rows = []
    for name, low, high in (*SIZE_BINS, ("all", 0.0, math.inf)):
        members = (fit.sides >= low) & (fit.sides < high)
        count = int(members.sum())
        if count == 0:
            continue
        shares = {level: float((landing[members] == i).mean())
                  for i, level in enumerate(fit.levels)}
        shares[NO_LEVEL] = float((landing[members] == -1).mean())
        rows.append({"bin": name, "objects": count, "levels": shares,
                     "median_positives": float(np.median(total[members])),
                     "none": float((total[members] == 0).mean()),
                     "one": float((total[members] == 1).mean())})
    return rows


def format_fit_table(fit: LevelFit) -> str:
    """The fit as a markdown table: objects by size, the share landing on each level,
    the median positives per object and the shares with none and with only one."""
    columns = [*fit.levels, NO_LEVEL]
    head = (f"objects by longer side after the resize; levels {', '.join(fit.levels)} "
            f"(strides {', '.join(map(str, fit.strides))}), SIZES_OF_INTEREST "
            f"{[int(s) if float(s).is_integer() else s for s in fit.sizes_of_interest]}, "
            f"center radius {fit.center_sampling_radius:g}")
    lines = [head, "",
             "| size (px) | objects | " + " | ".join(f"on {c}" for c in columns)
             + " | positives (median) | with none | with one |",
             "| --- " * (len(columns) + 5) + "|"]
    for row in bin_rows(fit):
        shares = " | ".join(_percent(row["levels"][c]) for c in columns)
        lines.append(f"| {row['bin']} | {row['objects']} | {shares} | "
                     f"{row['median_positives']:g} | {_percent(row['none'])} | "
                     f"{_percent(row['one'])} |")
    return "\n".join(lines)


def _percent(share: float) -> str:
    return f"{100.0 * share:.0f}%" if share else "-"


# A level that fewer than this share of the objects land on learns background only.
EMPTY_LEVEL_SHARE = 0.005
# Warn when more than this share of the objects get no positive location at all ...
NO_POSITIVE_SHARE = 0.005
# ... or when more than this share of a size's objects get a single one.
SINGLE_POSITIVE_SHARE = 0.25
LEVEL_KEYS = ("MODEL.FCOS.IN_FEATURES (with MODEL.RESNETS.OUT_FEATURES and MODEL.FPN."
              "IN_FEATURES: res2 gives p2)")


def fit_warnings(fit: LevelFit) -> List[str]:
    """What the data asks of the config, each naming the keys to change; [] when it fits."""
    if fit.positives.shape[0] == 0:
        return ["the training set has no boxes: nothing to fit the levels to"]
    rows = {row["bin"]: row for row in bin_rows(fit)}
    found = []
    none = rows["all"]["none"]
    if none > NO_POSITIVE_SHARE:
        bins = ", ".join(f"{r['bin']} px: {_percent(r['none'])}" for name, r in rows.items()
                         if name != "all" and r["none"] > 0)
        found.append(f"{_percent(none)} of the objects get no positive location ({bins}); "
                     f"they are never trained. Change MODEL.FCOS.SIZES_OF_INTEREST, "
                     f"MODEL.FCOS.CENTER_SAMPLING_RADIUS or {LEVEL_KEYS}")
    landing = fit.landing_level()
    empty = [level for i, level in enumerate(fit.levels)
             if (landing == i).mean() < EMPTY_LEVEL_SHARE]
    if empty:
        found.append(f"level(s) {', '.join(empty)} get no objects and learn background only: "
                     f"drop them from MODEL.FCOS.IN_FEATURES (MODEL.FCOS.TOP_BLOCKS_IN \"\" "
                     f"without p6/p7) or lower MODEL.FCOS.SIZES_OF_INTEREST")
    single = [r for name, r in rows.items() if name != "all" and r["one"] > SINGLE_POSITIVE_SHARE]
    if single:
        bins = ", ".join(f"{r['bin']} px: {_percent(r['one'])}" for r in single)
        finest = fit.levels[int(np.argmin(fit.strides))]
        found.append(f"many objects get a single positive location ({bins}); a finer level "
                     f"than {finest} ({LEVEL_KEYS}) or a larger "
                     f"MODEL.FCOS.CENTER_SAMPLING_RADIUS gives them more")
    return found
