"""The synthetic thin-shapes set: thin, structured and filled objects in larger images.

A second small-data regime (``python -m benchmarks.train_quality --regime thin``), closer
to real data with line-drawn objects than ``synthetic_shapes``: each image has its shorter side
``SHORT_SIDE`` (256) px and its longer side uniform in [256, ``MAX_LONG_SIDE``] (352) px,
landscape or portrait, so that ``INPUT.MIN_SIZE_* 256`` / ``MAX_SIZE_* 352`` keep every
image at its own size. It holds 1 to ``MAX_OBJECTS`` objects (about ``EMPTY_FRACTION`` of
the images none), so most of it is background. ``CLASS_NAMES`` are 10 classes: 3 filled
(disc, square, triangle) and 7 thin: outlines (ring, square and triangle outlines), crosses
of thin strokes (plus, hash) and line-drawn digit-like glyphs (seven, four). Strokes are
``max(1, d / STROKE_DIVISOR)`` px wide for an object of diameter d, d log-uniform in
[``MIN_DIAMETER``, ``MAX_DIAMETER``] (boxes of about 10-100 px). Glyphs turn by at most
``GLYPH_MAX_DEGREES`` (so that a seven stays a seven), every other shape by any angle.
Colours come from ``synthetic.PALETTE`` whatever the class, backgrounds are textures.

Names: ``synthetic_thin_train`` (400 images) and ``synthetic_thin_val`` (100), registered
by ``import fcos_d2.data``; annotations are COCO as in ``synthetic`` (category ids 1..10,
tight XYWH box of the visible pixels, ``area`` their count). Their twins with instance masks,
``synthetic_thin_masks_train`` and ``synthetic_thin_masks_val`` (``MASK_DATASET_SPLITS``),
are the same images and boxes with each object's visible pixels as an RLE "segmentation"
(the thin mask regime of ``python -m benchmarks.masks --regime thin``). Generation is
deterministic: image ``i`` depends only on (split seed, i). Cache:
``$FCOS_D2_DATASETS_CACHE/synthetic_thin_v1/<split>/`` (default ``~/.cache/fcos_d2``), and
``synthetic_thin_masks_v1`` for the set with masks, apart from ``synthetic_shapes_v1`` so
that the figures measured there stay valid; written to a temporary folder and renamed into
place under a file lock, as ``synthetic`` does.
"""
import functools
import json
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np
from PIL import Image, ImageDraw

from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import load_coco_json

from ..progress import Progress
from .masks import mask_to_rle
from .synthetic import (ANNOTATIONS_FILE, CACHE_ENV, IMAGES_FOLDER, exclusive_lock,
                        pick_color, tight_box)

CACHE_FOLDER = "synthetic_thin_v1"  # bump the version whenever the output changes
MASKS_CACHE_FOLDER = "synthetic_thin_masks_v1"  # v1 with an RLE "segmentation" per object
DATASET_SPLITS: Dict[str, str] = {"synthetic_thin_train": "train", "synthetic_thin_val": "val"}
MASK_DATASET_SPLITS: Dict[str, str] = {"synthetic_thin_masks_train": "train",
                                       "synthetic_thin_masks_val": "val"}
NUM_IMAGES: Dict[str, int] = {"train": 400, "val": 100}
SPLIT_SEEDS: Dict[str, int] = {"train": 20261201, "val": 20261202}
CLASS_NAMES: Tuple[str, ...] = ("disc", "square", "triangle", "ring", "square_outline",
                                "triangle_outline", "plus", "hash", "seven", "four")
SHORT_SIDE, MAX_LONG_SIDE = 256, 352
MAX_OBJECTS = 8
EMPTY_FRACTION = 0.03
MIN_DIAMETER, MAX_DIAMETER = 10.0, 100.0
STROKE_DIVISOR = 14.0
GLYPH_MAX_DEGREES = 25.0
MIN_BOX_SIZE = 8
MAX_HIDDEN_FRACTION = 0.5
PLACEMENT_TRIES = 12


def _regular(vertices: int, start_degrees: float) -> List[Tuple[float, float]]:
    angles = np.radians(start_degrees + np.arange(vertices) * 360.0 / vertices)
    return [(math.cos(a), math.sin(a)) for a in angles]


# Per class, unit-circumradius geometry: ("disc" | "ring", None), ("polygon", vertices)
# filled, or ("strokes", polylines) drawn with the stroke width (a closed outline repeats
# its first vertex).
_SQUARE, _TRIANGLE = _regular(4, 45), _regular(3, -90)
_GEOMETRY = {
    "disc": ("disc", None), "ring": ("ring", None),
    "square": ("polygon", _SQUARE), "triangle": ("polygon", _TRIANGLE),
    "square_outline": ("strokes", [_SQUARE + _SQUARE[:1]]),
    "triangle_outline": ("strokes", [_TRIANGLE + _TRIANGLE[:1]]),
    "plus": ("strokes", [[(-1, 0), (1, 0)], [(0, -1), (0, 1)]]),
    "hash": ("strokes", [[(-0.33, -0.94), (-0.33, 0.94)], [(0.33, -0.94), (0.33, 0.94)],
                         [(-0.94, -0.33), (0.94, -0.33)], [(-0.94, 0.33), (0.94, 0.33)]]),
    "seven": ("strokes", [[(-0.6, -0.8), (0.6, -0.8), (-0.15, 0.95)]]),
    "four": ("strokes", [[(0.25, 0.97), (0.25, -0.97), (-0.6, 0.35), (0.65, 0.35)]]),
}
_GLYPHS = ("seven", "four")


class ThinObject(NamedTuple):
    """One drawn object: its class, drawn pixel count and (H, W) visible mask."""

    class_index: int
    full_area: int
    visible: np.ndarray


def stroke_width(diameter: float) -> int:
    """The stroke width in px of thin objects of this diameter (>= 1)."""
    return max(1, int(round(diameter / STROKE_DIVISOR)))


def thin_shape_mask(kind: str, *, size: Tuple[int, int], center: Tuple[float, float],
                    radius: float, angle: float = 0.0) -> np.ndarray:
    """Rasterises one shape of ``CLASS_NAMES`` without anti-aliasing.

    Args:
        size: (H, W) of the image; center: (x, y) px; radius: circumradius px;
        angle: rotation in radians.

    Returns:
        (H, W) bool mask of the drawn pixels.
    """
    height, width = size
    canvas = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    cx, cy = center
    form, geometry = _GEOMETRY[kind]
    stroke = stroke_width(2 * radius)
    if form in ("disc", "ring"):
        bounds = [cx - radius, cy - radius, cx + radius, cy + radius]
        draw.ellipse(bounds, fill=1 if form == "disc" else None,
                     outline=1 if form == "ring" else None, width=stroke)
        return np.asarray(canvas, dtype=bool)
    cos, sin = math.cos(angle), math.sin(angle)
    place = lambda pts: [(cx + radius * (x * cos - y * sin),  # noqa: E731
                          cy + radius * (x * sin + y * cos)) for x, y in pts]
    if form == "polygon":
        draw.polygon(place(geometry), fill=1)
    else:
        for line in geometry:
            draw.line(place(line), fill=1, width=stroke, joint="curve")
    return np.asarray(canvas, dtype=bool)


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """(H, W, 3) float32 texture: flat, gradient, stripes or clouds, plus noise."""
    kind = rng.integers(4)
    c0, c1 = rng.uniform(0, 255, size=(2, 1, 1, 3)).astype(np.float32)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    angle = rng.uniform(0, 2 * math.pi)
    along = xx * math.cos(angle) + yy * math.sin(angle)  # (H, W)
    if kind == 0:
        image = np.broadcast_to(c0, (height, width, 3))
    elif kind == 1:
        t = (along - along.min()) / (along.max() - along.min())
        image = c0 + t[..., None] * (c1 - c0)
    elif kind == 2:
        t = 0.5 + 0.5 * np.sin(along * (2 * math.pi / rng.uniform(8, 48)))
        image = c0 + t[..., None] * (c1 - c0)
    else:
        cells = rng.integers(0, 256, size=(rng.integers(2, 9),) * 2 + (3,), dtype=np.uint8)
        image = np.asarray(Image.fromarray(cells).resize((width, height), Image.BICUBIC))
    noise = rng.standard_normal((height, width, 3), dtype=np.float32)
    return (image + noise * np.float32(rng.uniform(2, 16))).astype(np.float32)


def _keeps_visible(full_area: int, visible: np.ndarray) -> bool:
    if visible.sum() < (1 - MAX_HIDDEN_FRACTION) * full_area:
        return False
    return max(tight_box(visible)[2:]) >= MIN_BOX_SIZE


def _add_object(rng: np.random.Generator, canvas: np.ndarray, objects: List[ThinObject],
                diameter: float) -> List[ThinObject]:
    """Paints one object into the (H, W, 3) `canvas` where it hides no earlier one by more
    than ``MAX_HIDDEN_FRACTION``. Returns the objects with updated visible masks, plus the
    new one unless no place was found."""
    height, width = canvas.shape[:2]
    class_index = int(rng.integers(len(CLASS_NAMES)))
    kind, radius = CLASS_NAMES[class_index], diameter / 2
    limit = GLYPH_MAX_DEGREES if kind in _GLYPHS else 180.0
    for _ in range(PLACEMENT_TRIES):
        center = (rng.uniform(radius, width - radius), rng.uniform(radius, height - radius))
        mask = thin_shape_mask(kind, size=(height, width), center=center, radius=radius,
                               angle=math.radians(rng.uniform(-limit, limit)))
        if not mask.any():
            continue
        covered = [obj.visible & ~mask for obj in objects]
        if all(_keeps_visible(o.full_area, v) for o, v in zip(objects, covered)) \
                and _keeps_visible(int(mask.sum()), mask):
            canvas[mask] = pick_color(rng, canvas, mask)
            return [o._replace(visible=v) for o, v in zip(objects, covered)] \
                + [ThinObject(class_index, int(mask.sum()), mask)]
    return objects


def render_thin_image(*, seed: int, index: int) -> Tuple[np.ndarray, List[Tuple[int, np.ndarray]]]:
    """Image `index` of the split with seed `seed`: (H, W, 3) uint8 RGB and its objects,
    bottom first, as (class index, (H, W) visible mask)."""
    rng = np.random.default_rng((seed, index))
    long_side = int(rng.integers(SHORT_SIDE, MAX_LONG_SIDE + 1))
    height, width = (SHORT_SIDE, long_side) if rng.random() < 0.5 else (long_side, SHORT_SIDE)
    canvas = _background(rng, height, width)
    count = 0 if rng.random() < EMPTY_FRACTION else int(rng.integers(1, MAX_OBJECTS + 1))
    diameters = np.exp(rng.uniform(math.log(MIN_DIAMETER), math.log(MAX_DIAMETER), size=count))
    objects: List[ThinObject] = []
    for diameter in np.sort(diameters)[::-1]:  # large first: small ones stay on top
        objects = _add_object(rng, canvas, objects, float(diameter))
    pixels = np.clip(np.rint(canvas), 0, 255).astype(np.uint8)
    return pixels, [(obj.class_index, obj.visible) for obj in objects]


def write_thin_split(out_dir: Path, *, split: str, num_images: int,
                     progress: bool = False, masks: bool = False) -> None:
    """Renders the first `num_images` images of `split` into `out_dir` (``images/`` and
    COCO ``annotations.json``), not atomically (see ``ensure_synthetic_thin``); with
    ``progress``, reports the images done and the ETA (``fcos_d2.progress``); with
    ``masks``, each annotation also holds its visible pixels as an RLE "segmentation"."""
    images_dir = Path(out_dir) / IMAGES_FOLDER
    images_dir.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    folder = MASKS_CACHE_FOLDER if masks else CACHE_FOLDER
    bar = Progress(num_images, f"synthetic thin shapes{' with masks' if masks else ''}, "
                   f"{split} split: generating (first use)", "images", enabled=progress)
    for index in range(num_images):
        pixels, objects = render_thin_image(seed=SPLIT_SEEDS[split], index=index)
        image_id, file_name = index + 1, f"{index:06d}.png"
        Image.fromarray(pixels).save(images_dir / file_name, compress_level=1)
        bar.update(1)
        images.append({"id": image_id, "file_name": file_name,
                       "height": pixels.shape[0], "width": pixels.shape[1]})
        for class_index, visible in objects:
            annotations.append({"id": len(annotations) + 1, "image_id": image_id,
                                "category_id": class_index + 1, "bbox": list(tight_box(visible)),
                                "area": int(visible.sum()), "iscrowd": 0,
                                **({"segmentation": mask_to_rle(visible)} if masks else {})})
    coco = {"info": {"description": f"fcos_d2 synthetic thin shapes, {folder}",
                     "split": split, "num_images": num_images, "seed": SPLIT_SEEDS[split]},
            "licenses": [], "images": images, "annotations": annotations,
            "categories": [{"id": i + 1, "name": name, "supercategory": "shape"}
                           for i, name in enumerate(CLASS_NAMES)]}
    with open(Path(out_dir) / ANNOTATIONS_FILE, "w") as f:
        json.dump(coco, f)
    bar.close()


def thin_cache_root(*, masks: bool = False) -> Path:
    """``$FCOS_D2_DATASETS_CACHE/synthetic_thin_v1`` (default ``~/.cache/fcos_d2/...``), or
    ``.../synthetic_thin_masks_v1`` for the set with masks."""
    base = os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "fcos_d2")
    return Path(os.path.expandvars(base)).expanduser() / (MASKS_CACHE_FOLDER if masks
                                                          else CACHE_FOLDER)


def ensure_synthetic_thin(split: str, *, root: Optional[Path] = None,
                          num_images: Optional[int] = None, masks: bool = False) -> Path:
    """Generates a split unless cached (atomically, under a lock) and returns its folder:
    ``root/<split>`` for ``NUM_IMAGES[split]`` images, else ``root/<split>_<count>``; root
    defaults to ``thin_cache_root(masks=masks)``."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"synthetic thin shapes: unknown split '{split}'; use one of "
                         f"{sorted(SPLIT_SEEDS)}")
    root = thin_cache_root(masks=masks) if root is None else Path(root)
    count = NUM_IMAGES[split] if num_images is None else int(num_images)
    split_dir = root / (split if count == NUM_IMAGES[split] else f"{split}_{count}")
    if (split_dir / ANNOTATIONS_FILE).is_file():
        return split_dir
    root.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(root / f".{split_dir.name}.lock"):
        if (split_dir / ANNOTATIONS_FILE).is_file():  # another process made it meanwhile
            return split_dir
        temporary = root / f".{split_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex}"
        try:
            write_thin_split(temporary, split=split, num_images=count, progress=True,
                             masks=masks)
            os.rename(temporary, split_dir)
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
    return split_dir


def register_synthetic_thin(root: Optional[Path] = None,
                            masks_root: Optional[Path] = None) -> None:
    """Registers ``DATASET_SPLITS`` (under `root`, default ``thin_cache_root()``) and
    ``MASK_DATASET_SPLITS`` (under `masks_root`, default ``thin_cache_root(masks=True)``)
    with detectron2 (names already there are left alone); nothing is generated before the
    data is first loaded or prepared."""
    roots = {False: thin_cache_root() if root is None else Path(root),
             True: thin_cache_root(masks=True) if masks_root is None else Path(masks_root)}
    for masks, splits in ((False, DATASET_SPLITS), (True, MASK_DATASET_SPLITS)):
        for name, split in splits.items():
            if name in DatasetCatalog.list():
                continue
            split_dir = roots[masks] / split
            DatasetCatalog.register(name, functools.partial(_load, split, roots[masks], name,
                                                            masks))
            MetadataCatalog.get(name).set(thing_classes=list(CLASS_NAMES),
                                          evaluator_type="coco",
                                          json_file=str(split_dir / ANNOTATIONS_FILE),
                                          image_root=str(split_dir / IMAGES_FOLDER))


def is_synthetic_thin(name: str) -> bool:
    """Whether `name` is one of the thin-shapes datasets (with or without masks)."""
    return name in DATASET_SPLITS or name in MASK_DATASET_SPLITS


def _load(split: str, root: Path, name: str, masks: bool = False) -> List[dict]:
    split_dir = ensure_synthetic_thin(split, root=root, masks=masks)
    return load_coco_json(str(split_dir / ANNOTATIONS_FILE), str(split_dir / IMAGES_FOLDER), name)


def prepare_synthetic_thin(name: str) -> Path:
    """Generates the split of registered name `name` where its metadata says it lives."""
    split_dir = Path(MetadataCatalog.get(name).json_file).parent
    masks = name in MASK_DATASET_SPLITS
    split = (MASK_DATASET_SPLITS if masks else DATASET_SPLITS)[name]
    return ensure_synthetic_thin(split, root=split_dir.parent, masks=masks)
