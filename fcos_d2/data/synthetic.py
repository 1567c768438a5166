"""The built-in synthetic shapes dataset: a small, fair detection task made on first use.

Names: ``synthetic_shapes_train`` (``NUM_IMAGES["train"]`` images) and
``synthetic_shapes_val`` (``NUM_IMAGES["val"]`` images), registered with detectron2 by
``import fcos_d2.data``. Each S x S RGB image (S = ``IMAGE_SIZE`` = 128) shows 0 to
``MAX_OBJECTS`` shapes on a textured background (noise, gradient, stripes, blobs, clouds).
Classes differ by shape only (``CLASS_NAMES``): every object takes a colour from one
``PALETTE`` whatever its class, and a random rotation. Shape diameters d are log-uniform in
[``MIN_DIAMETER``, ``MAX_DIAMETER``], so the boxes' longer sides spread evenly over the
octaves 8-16-32-64-128 px (FCOS's largest size range, max regression distance > 128, only
gets targets when the input is upscaled, e.g. to 256 px). About ``EMPTY_FRACTION`` of the images hold no object.

Annotations are COCO: category ids 1..K for classes 0..K-1, ``iscrowd`` 0, ``bbox`` the
XYWH tight box of the object's visible pixels and ``area`` their count. Shapes are drawn
without anti-aliasing and in decreasing size; a shape is re-placed (or dropped) when it
would hide more than ``MAX_HIDDEN_FRACTION`` of an earlier one or shrink its box below
``MIN_BOX_SIZE`` px.

Masks: ``synthetic_masks_train`` and ``synthetic_masks_val`` are the same images and
annotations plus each object's instance mask, its visible pixels exactly, as a COCO
``segmentation`` in compressed RLE (``fcos_d2.data.masks.mask_to_rle``).
RLE rather than polygons: a polygon rasterised by pycocotools does not give the pixels
Pillow drew, and an occluded shape or a ring has holes that COCO polygons cannot hold.
They live in their own cache folder (``MASKS_CACHE_FOLDER``), so that the detection
figures measured on ``synthetic_shapes_v1`` stay valid.

Generation is deterministic: image ``i`` of a split depends only on (split seed, i), so a
smaller count gives a prefix of the full split.

Cache: ``$FCOS_D2_DATASETS_CACHE/synthetic_shapes_v1/<split>/`` (``synthetic_shapes_v2``
for the masks) with ``images/*.png`` and ``annotations.json``. The environment variable
``FCOS_D2_DATASETS_CACHE`` (default ``~/.cache/fcos_d2``) is read when the names are
registered, i.e. when ``fcos_d2.data`` is first imported. A split is written to a temporary folder and renamed into place, under a
file lock, so an interrupted run or several processes at once never leave half a split.
"""
import contextlib
import functools
import json
import math
import os
import shutil
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
from PIL import Image, ImageDraw

from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import load_coco_json

from ..progress import Progress
from .masks import mask_to_rle

try:  # POSIX; elsewhere splits are still renamed into place, only without a lock
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

CACHE_ENV = "FCOS_D2_DATASETS_CACHE"
CACHE_FOLDER = "synthetic_shapes_v1"  # bump the version whenever the output changes
MASKS_CACHE_FOLDER = "synthetic_shapes_v2"  # v1 with an RLE "segmentation" per annotation
DATASET_SPLITS: Dict[str, str] = {"synthetic_shapes_train": "train", "synthetic_shapes_val": "val"}
MASK_DATASET_SPLITS: Dict[str, str] = {"synthetic_masks_train": "train",
                                       "synthetic_masks_val": "val"}
NUM_IMAGES: Dict[str, int] = {"train": 3000, "val": 300}
SPLIT_SEEDS: Dict[str, int] = {"train": 20240601, "val": 20240602}
CLASS_NAMES: Tuple[str, ...] = ("circle", "square", "triangle", "star", "cross", "ring")
IMAGE_SIZE = 128
MAX_OBJECTS = 6
EMPTY_FRACTION = 0.05
MIN_DIAMETER, MAX_DIAMETER = 9.0, 124.0
MIN_BOX_SIZE = 8
MAX_HIDDEN_FRACTION = 0.5
PLACEMENT_TRIES = 12
PALETTE = np.array(  # (P, 3) uint8: the object colours, shared by all classes
    [[230, 25, 25], [20, 170, 40], [30, 70, 230], [250, 220, 20], [20, 210, 220],
     [220, 40, 220], [250, 130, 10], [245, 245, 245], [15, 15, 15], [120, 50, 170]],
    dtype=np.uint8,
)
ANNOTATIONS_FILE, IMAGES_FOLDER = "annotations.json", "images"


def _outline(radii: List[float], degrees: np.ndarray) -> List[Tuple[float, float]]:
    """(V, 2) polygon vertices at the given radii and angles, x to the right and y down."""
    return [(r * math.cos(a), r * math.sin(a)) for r, a in zip(radii, np.radians(degrees))]


# Polygons with circumradius 1; circle and ring are drawn as discs.
_OUTLINES = {
    "square": _outline([1.0] * 4, np.arange(45, 360, 90)),
    "triangle": _outline([1.0] * 3, np.arange(-90, 270, 120)),
    "star": _outline([1.0, 0.42] * 5, np.arange(-90, 270, 36)),
    "cross": [(0.3, 0.95), (0.3, 0.3), (0.95, 0.3), (0.95, -0.3), (0.3, -0.3), (0.3, -0.95),
              (-0.3, -0.95), (-0.3, -0.3), (-0.95, -0.3), (-0.95, 0.3), (-0.3, 0.3),
              (-0.3, 0.95)],  # arm ends' corners on the unit circle: 0.3**2 + 0.95**2 ~ 1
}
_RING_HOLE = 0.55  # inner radius of a ring, as a fraction of its outer radius
_YY, _XX = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE].astype(np.float32)  # (S, S) each


@dataclass(frozen=True)
class SceneObject:
    """One drawn shape: its class, colour, drawn pixel count and (S, S) visible mask."""

    class_index: int
    color: Tuple[int, int, int]
    full_area: int
    visible_mask: np.ndarray


def datasets_cache_root(*, masks: bool = False) -> Path:
    """Returns the folder of the synthetic set: ``$FCOS_D2_DATASETS_CACHE/synthetic_shapes_v1``,
    or ``.../synthetic_shapes_v2`` for the set with masks."""
    base = os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "fcos_d2")
    return Path(os.path.expandvars(base)).expanduser() / (MASKS_CACHE_FOLDER if masks
                                                          else CACHE_FOLDER)


def is_synthetic(name: str) -> bool:
    """Whether `name` is one of the built-in synthetic datasets (with or without masks)."""
    return name in DATASET_SPLITS or name in MASK_DATASET_SPLITS


def shape_mask(kind: str, *, center: Tuple[float, float], radius: float,
               angle: float = 0.0) -> np.ndarray:
    """Rasterises one shape without anti-aliasing.

    Args:
        kind: one of ``CLASS_NAMES``.
        center: (x, y) in pixels; radius: the radius of the shape's circumcircle in pixels.
        angle: rotation in radians (circle and ring look the same at every angle).

    Returns:
        (S, S) bool mask of the drawn pixels.
    """
    canvas = Image.new("L", (IMAGE_SIZE, IMAGE_SIZE), 0)
    draw = ImageDraw.Draw(canvas)
    cx, cy = center
    if kind in ("circle", "ring"):
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=1)
        if kind == "ring":
            hole = radius * _RING_HOLE
            draw.ellipse([cx - hole, cy - hole, cx + hole, cy + hole], fill=0)
    else:
        cos, sin = math.cos(angle), math.sin(angle)
        points = [(cx + radius * (x * cos - y * sin), cy + radius * (x * sin + y * cos))
                  for x, y in _OUTLINES[kind]]
        draw.polygon(points, fill=1)
    return np.asarray(canvas, dtype=bool)


def tight_box(mask: np.ndarray) -> Tuple[int, int, int, int]:
    """Returns the XYWH box, in pixel edges, of the True pixels of a non-empty (H, W) mask."""
    xs = np.flatnonzero(mask.any(axis=0))
    ys = np.flatnonzero(mask.any(axis=1))
    return int(xs[0]), int(ys[0]), int(xs[-1] + 1 - xs[0]), int(ys[-1] + 1 - ys[0])


def _background(rng: np.random.Generator) -> np.ndarray:
    """Returns an (S, S, 3) float32 texture of random colours."""
    kind = rng.integers(5)
    c0, c1 = rng.uniform(0, 255, size=(2, 1, 1, 3)).astype(np.float32)
    angle = rng.uniform(0, 2 * math.pi)
    along = _XX * math.cos(angle) + _YY * math.sin(angle)  # (S, S) position along `angle`
    if kind == 0:  # flat colour with noise
        image = c0 + _noise(rng, sigma=rng.uniform(4, 28), channels=1)
    elif kind == 1:  # linear gradient
        t = (along - along.min()) / (along.max() - along.min())
        image = c0 + t[..., None] * (c1 - c0)
    elif kind == 2:  # smooth or hard stripes
        t = 0.5 + 0.5 * np.sin(along * (2 * math.pi / rng.uniform(6, 32)))
        image = c0 + (t if rng.random() < 0.5 else t > 0.5)[..., None] * (c1 - c0)
    elif kind == 3:  # soft blobs of random colours
        image = np.broadcast_to(c0, (IMAGE_SIZE, IMAGE_SIZE, 3))
        for _ in range(rng.integers(3, 9)):
            x, y = rng.uniform(0, IMAGE_SIZE, size=2)
            sigma, color = rng.uniform(6, 36), rng.uniform(0, 255, size=3)
            alpha = np.exp(((_XX - x) ** 2 + (_YY - y) ** 2) * np.float32(-0.5 / sigma**2))
            alpha = alpha[..., None]  # (S, S, 1)
            image = image * (1 - alpha) + color * alpha
    else:  # clouds: a coarse random grid, smoothly upsampled
        cells = rng.integers(0, 256, size=(rng.integers(2, 9),) * 2 + (3,), dtype=np.uint8)
        image = np.asarray(Image.fromarray(cells).resize((IMAGE_SIZE,) * 2, Image.BICUBIC))
    return (image + _noise(rng, sigma=rng.uniform(0, 6), channels=3)).astype(np.float32)


def _noise(rng: np.random.Generator, *, sigma: float, channels: int) -> np.ndarray:
    """Returns (S, S, channels) float32 Gaussian noise."""
    shape = (IMAGE_SIZE, IMAGE_SIZE, channels)
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(sigma)


def pick_color(rng: np.random.Generator, canvas: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Picks a palette colour that stands out from the pixels it will cover."""
    under = canvas[mask]  # (n, 3)
    under = under[:: max(1, len(under) // 512)]  # a sample is enough to judge contrast
    squared = ((under[None] - PALETTE[:, None].astype(np.float32)) ** 2).sum(axis=2)  # (P, n)
    contrast = (squared > 60.0**2).mean(axis=1)  # (P,) share of pixels it stands out from
    good = np.flatnonzero(contrast >= 0.9)
    index = rng.choice(good) if len(good) else int(np.argmax(contrast))
    return PALETTE[index]


def _keeps_visible(obj: SceneObject, visible: np.ndarray) -> bool:
    if visible.sum() < (1 - MAX_HIDDEN_FRACTION) * obj.full_area:
        return False
    return max(tight_box(visible)[2:]) >= MIN_BOX_SIZE


def _add_object(rng: np.random.Generator, canvas: np.ndarray, objects: List[SceneObject], *,
                diameter: float) -> List[SceneObject]:
    """Paints one shape into the (S, S, 3) `canvas` where it hides no earlier object too much.

    Returns the objects with updated visible masks, plus the new one unless no place was found.
    """
    class_index = int(rng.integers(len(CLASS_NAMES)))
    radius = diameter / 2
    for _ in range(PLACEMENT_TRIES):
        center = tuple(rng.uniform(radius, IMAGE_SIZE - radius, size=2))
        mask = shape_mask(CLASS_NAMES[class_index], center=center, radius=radius,
                          angle=rng.uniform(0, 2 * math.pi))
        new = SceneObject(class_index, (0, 0, 0), int(mask.sum()), mask)
        covered = [obj.visible_mask & ~mask for obj in objects]
        if all(map(_keeps_visible, objects + [new], covered + [mask])):
            color = pick_color(rng, canvas, mask)
            canvas[mask] = color
            new = replace(new, color=tuple(int(c) for c in color))
            return [replace(o, visible_mask=v) for o, v in zip(objects, covered)] + [new]
    return objects


def render_image(*, seed: int, index: int) -> Tuple[np.ndarray, List[SceneObject]]:
    """Renders image `index` of the split with seed `seed`.

    Returns:
        (S, S, 3) uint8 RGB pixels, and the objects drawn, bottom first.
    """
    rng = np.random.default_rng((seed, index))
    canvas = _background(rng)
    count = 0 if rng.random() < EMPTY_FRACTION else int(rng.integers(1, MAX_OBJECTS + 1))
    log_d = rng.uniform(math.log(MIN_DIAMETER), math.log(MAX_DIAMETER), size=count)
    objects: List[SceneObject] = []
    for diameter in np.sort(np.exp(log_d))[::-1]:  # large first: small ones stay on top
        objects = _add_object(rng, canvas, objects, diameter=float(diameter))
    return np.clip(np.rint(canvas), 0, 255).astype(np.uint8), objects


def write_split(out_dir: Path, *, split: str, num_images: int, masks: bool = False,
                progress: bool = False) -> None:
    """Renders the first images of a split into a folder, not atomically (see
    ``ensure_synthetic_shapes``).

    Args:
        out_dir: receives ``images/<index:06d>.png`` and COCO ``annotations.json``.
        split: "train" or "val"; it chooses the seed.
        num_images: how many images; image ``i`` gets image id ``i + 1``.
        masks: also write each object's visible pixels as an RLE "segmentation".
        progress: report the images done and the ETA (``fcos_d2.progress``).
    """
    images_dir = Path(out_dir) / IMAGES_FOLDER
    images_dir.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    bar = Progress(num_images, f"synthetic shapes{' with masks' if masks else ''}, {split} "
                   "split: generating (first use)", "images", enabled=progress)
    for index in range(num_images):
        pixels, objects = render_image(seed=SPLIT_SEEDS[split], index=index)
        image_id, file_name = index + 1, f"{index:06d}.png"
        Image.fromarray(pixels).save(images_dir / file_name, compress_level=1)
        bar.update(1)
        images.append({"id": image_id, "file_name": file_name,
                       "height": IMAGE_SIZE, "width": IMAGE_SIZE})
        for obj in objects:
            annotations.append({
                "id": len(annotations) + 1, "image_id": image_id,
                "category_id": obj.class_index + 1, "bbox": list(tight_box(obj.visible_mask)),
                "area": int(obj.visible_mask.sum()), "iscrowd": 0,
                **({"segmentation": mask_to_rle(obj.visible_mask)} if masks else {}),
            })
    coco = {
        "info": {"description": "fcos_d2 synthetic shapes, "
                 f"{MASKS_CACHE_FOLDER if masks else CACHE_FOLDER}", "split": split,
                 "num_images": num_images, "seed": SPLIT_SEEDS[split]},
        "licenses": [],
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i + 1, "name": name, "supercategory": "shape"}
                       for i, name in enumerate(CLASS_NAMES)],
    }
    with open(Path(out_dir) / ANNOTATIONS_FILE, "w") as f:
        json.dump(coco, f)
    bar.close()


def ensure_synthetic_shapes(split: str, *, root: Optional[Path] = None,
                            num_images: Optional[int] = None, masks: bool = False) -> Path:
    """Generates a split unless it is already cached, and returns its folder.

    Safe against interruption and concurrent callers: the split is written to a temporary
    folder next to it and renamed into place, under an exclusive file lock.

    Args:
        split: "train" or "val".
        root: the dataset folder; default ``datasets_cache_root(masks=masks)``.
        num_images: default ``NUM_IMAGES[split]``; other counts go to ``<split>_<count>``.
        masks: the split with an RLE "segmentation" per annotation.

    Returns:
        The split folder, holding ``annotations.json`` and ``images/``.
    """
    if split not in SPLIT_SEEDS:
        raise ValueError(f"synthetic shapes: unknown split '{split}'; use one of "
                         f"{sorted(SPLIT_SEEDS)}")
    root = datasets_cache_root(masks=masks) if root is None else Path(root)
    count = NUM_IMAGES[split] if num_images is None else int(num_images)
    split_dir = root / (split if count == NUM_IMAGES[split] else f"{split}_{count}")
    if (split_dir / ANNOTATIONS_FILE).is_file():
        return split_dir
    root.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(root / f".{split_dir.name}.lock") as locked:
        if (split_dir / ANNOTATIONS_FILE).is_file():  # another process made it meanwhile
            return split_dir
        if locked:  # no one else is writing: temporary folders left are from killed runs
            for stale in root.glob(f".{split_dir.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        _write_atomically(split_dir, split=split, num_images=count, masks=masks)
    return split_dir


def _write_atomically(split_dir: Path, *, split: str, num_images: int, masks: bool) -> None:
    # not tempfile.mkdtemp: its folders are private (0700) whatever the umask says
    temporary = split_dir.parent / f".{split_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex}"
    temporary.mkdir()
    try:
        write_split(temporary, split=split, num_images=num_images, masks=masks, progress=True)
        os.rename(temporary, split_dir)
    except BaseException as error:
        shutil.rmtree(temporary, ignore_errors=True)
        if (split_dir / ANNOTATIONS_FILE).is_file():  # lost a race where there is no lock
            return
        if isinstance(error, OSError) and split_dir.exists():
            raise OSError(f"synthetic shapes: {split_dir} exists but has no "
                          f"{ANNOTATIONS_FILE}; remove it and retry") from error
        raise


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[bool]:
    """Holds an exclusive lock on `path` (released if the process dies); yields whether it
    could be taken, which is False only where ``fcntl`` does not exist."""
    if fcntl is None:  # pragma: no cover
        yield False
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_synthetic_shapes(name: str, *, root: Optional[Path] = None) -> List[dict]:
    """Generates the split of dataset `name` if needed, and loads it as detectron2 dicts
    (with a "segmentation" per annotation for the ``MASK_DATASET_SPLITS``)."""
    split, masks = _split_of(name)
    split_dir = ensure_synthetic_shapes(split, root=root, masks=masks)
    return load_coco_json(str(split_dir / ANNOTATIONS_FILE), str(split_dir / IMAGES_FOLDER), name)


def register_synthetic_shapes(root: Optional[Path] = None,
                              masks_root: Optional[Path] = None) -> None:
    """Registers ``DATASET_SPLITS`` and ``MASK_DATASET_SPLITS`` with detectron2's catalogs;
    names already registered are left as they are. Nothing is generated before the data is
    first loaded (or prepared).

    Args:
        root: the folder of the set without masks; default ``datasets_cache_root()``, read now.
        masks_root: the folder of the set with masks; default
            ``datasets_cache_root(masks=True)``, read now.
    """
    roots = {False: datasets_cache_root() if root is None else Path(root),
             True: datasets_cache_root(masks=True) if masks_root is None else Path(masks_root)}
    for masks, splits in ((False, DATASET_SPLITS), (True, MASK_DATASET_SPLITS)):
        for name, split in splits.items():
            if name in DatasetCatalog.list():
                continue
            folder = roots[masks]
            DatasetCatalog.register(name, functools.partial(load_synthetic_shapes, name,
                                                            root=folder))
            MetadataCatalog.get(name).set(
                thing_classes=list(CLASS_NAMES), evaluator_type="coco",
                json_file=str(folder / split / ANNOTATIONS_FILE),
                image_root=str(folder / split / IMAGES_FOLDER),
            )


def prepare_synthetic_shapes(name: str) -> Path:
    """Generates the split of the registered synthetic dataset `name` where its metadata
    says it lives (``COCOEvaluator`` reads ``json_file`` when built), and returns its folder."""
    split, masks = _split_of(name)
    split_dir = Path(MetadataCatalog.get(name).json_file).parent
    return ensure_synthetic_shapes(split, root=split_dir.parent, masks=masks)


def _split_of(name: str) -> Tuple[str, bool]:
    """(split, with masks) of a synthetic dataset name."""
    if name in MASK_DATASET_SPLITS:
        return MASK_DATASET_SPLITS[name], True
    if name in DATASET_SPLITS:
        return DATASET_SPLITS[name], False
    raise ValueError(f"synthetic shapes: unknown dataset '{name}'; use one of "
                     f"{sorted({**DATASET_SPLITS, **MASK_DATASET_SPLITS})}")
