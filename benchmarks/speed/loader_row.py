"""The loader row of ``python -m benchmarks.speed``: images per second of one loader worker,
i.e. the dataset mapper alone in one process: fcos-d2's ``FCOSDatasetMapper`` against
detectron2's ``DatasetMapper``, on 800x1333 JPEGs with the augmentations of the COCO
configs (``ResizeShortestEdge`` to a short side of 640-800 by 32, at most 1333, and a
random horizontal flip), 20 boxes each, interleaved image by image."""
import statistics
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
from PIL import Image

TARGET = 0.95  # fcos-d2's throughput over detectron2's


def write_jpegs(folder: Path, count: int, height: int = 800, width: int = 1333) -> List[dict]:
    """``count`` photo-like JPEGs (smooth colour fields plus noise, quality 90) and their
    detectron2 dataset dicts with 20 boxes each."""
    rng = np.random.default_rng(0)
    rows, cols = np.mgrid[0:height, 0:width].astype(np.float32)
    records = []
    for i in range(count):
        phase = rng.uniform(0, 6.3, 3)
        channels = [127 + 100 * np.sin(rows / (40 + 30 * c) + cols / (70 + 20 * c) + phase[c])
                    for c in range(3)]
        pixels = np.stack(channels, axis=2) + rng.normal(0, 12, (height, width, 3))
        path = folder / f"{i}.jpg"
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(path, quality=90)
        largest = min(200, height // 2, width // 2)
        x0, y0 = rng.uniform(0, width - largest, 20), rng.uniform(0, height - largest, 20)
        sizes = rng.uniform(largest / 20, largest, (20, 2))
        records.append({"file_name": str(path), "image_id": i, "height": height, "width": width,
                        "annotations": [{"bbox": [float(x), float(y), float(w), float(h)],
                                         "bbox_mode": 1, "category_id": int(k % 80), "iscrowd": 0}
                                        for x, y, (w, h), k in zip(x0, y0, sizes, range(20))]})
    return records


def coco_cfg():
    """configs/FCOS-R50.yaml's config (the COCO configs' INPUT augmentations)."""
    from benchmarks.speed import contenders as bc

    return bc.fcos_d2_cfg("cpu")


def mapper_throughput(images: int = 8, repeats: int = 3,
                      size: Tuple[int, int] = (800, 1333)) -> Dict[str, object]:
    """Images per second of each mapper (training mode), the median of ``repeats`` passes
    over ``images`` JPEGs of ``size`` (H, W) after one warm-up pass, the mappers
    alternating image by image (and which goes first alternating too).

    Returns:
        {"fcos-d2": images/s, "detectron2": images/s, "ratio": fcos-d2 / detectron2}.
    """
    from detectron2.data import DatasetMapper

    from fcos_d2.data.mapper import FCOSDatasetMapper

    cfg = coco_cfg()
    mappers = {"fcos-d2": FCOSDatasetMapper(cfg, is_train=True),
               "detectron2": DatasetMapper(cfg, is_train=True)}
    with tempfile.TemporaryDirectory() as folder:
        records = write_jpegs(Path(folder), images, *size)
        seconds = {name: [] for name in mappers}
        for repeat in range(repeats + 1):  # the first pass warms up (file cache, allocator)
            passes = {name: 0.0 for name in mappers}
            for i, record in enumerate(records):
                # which mapper goes first alternates, so that neither always finds the
                # file and the allocator warmed by the other
                order = list(mappers.items())[::(-1) ** i]
                for name, mapper in order:
                    start = time.perf_counter()
                    mapper(record)
                    passes[name] += time.perf_counter() - start
            if repeat:
                for name, value in passes.items():
                    seconds[name].append(value)
    rates = {name: images / statistics.median(values) for name, values in seconds.items()}
    return {**rates, "ratio": rates["fcos-d2"] / rates["detectron2"]}


def row(repeats: int) -> List[dict]:
    result = mapper_throughput(repeats=repeats)
    print("\n[loader, one worker: dataset mapper on 800x1333 JPEGs, COCO augmentations]")
    for name in ("fcos-d2", "detectron2"):
        print(f"  {name:12s} {result[name]:6.1f} images/s")
    name = f"loader images/s per worker, fcos-d2 / detectron2 (target >= {TARGET})"
    print(f"  ratio {result['ratio']:.2f} ({'met' if result['ratio'] >= TARGET else 'missed'})")
    return [{"row": "loader", "fcos_d2_images_per_s": result["fcos-d2"],
             "detectron2_images_per_s": result["detectron2"], "ratio": result["ratio"],
             "targets": {name: result["ratio"]}}]
