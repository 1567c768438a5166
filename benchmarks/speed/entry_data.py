"""The inputs of the entry row (``entry_row``): a small COCO-format test set of smooth random
images with a few solid boxes each, and a seeded random-weights checkpoint of the model.

The images are random colours on a grid of 1/32 of the size, upscaled bilinearly (smooth,
so that JPEG keeps them small), with ``BOXES_PER_IMAGE`` rectangles of one colour each,
annotated with random classes. Random weights give no AP: the row times, it does not score.
"""
import json
from pathlib import Path
from typing import Tuple

import torch
import torch.nn.functional as F
from PIL import Image

BOXES_PER_IMAGE = 3


def smooth_image(generator: torch.Generator, height: int, width: int) -> torch.Tensor:
    """(H, W, 3) uint8: random colours on a coarse grid, bilinearly upscaled."""
    coarse = torch.rand(1, 3, max(2, height // 32), max(2, width // 32), generator=generator)
    image = F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    return (image[0] * 255).round().byte().permute(1, 2, 0)  # (3, H, W) -> (H, W, 3)


def draw_boxes(image: torch.Tensor, generator: torch.Generator, count: int) -> list:
    """Paints ``count`` rectangles of one random colour each into ``image`` (H, W, 3), in
    place; returns their [x, y, w, h] boxes (each side 1/8 to 1/3 of the image's)."""
    height, width = image.shape[:2]
    boxes = []
    for _ in range(count):
        fractions = torch.rand(4, generator=generator).tolist()
        w = max(1, int(width * (1 / 8 + fractions[0] * (1 / 3 - 1 / 8))))
        h = max(1, int(height * (1 / 8 + fractions[1] * (1 / 3 - 1 / 8))))
        x, y = int((width - w) * fractions[2]), int((height - h) * fractions[3])
        image[y:y + h, x:x + w] = torch.randint(0, 256, (3,), generator=generator).byte()
        boxes.append([float(x), float(y), float(w), float(h)])
    return boxes


def write_dataset(folder: Path, images: int, height: int, width: int, num_classes: int = 80,
                  seed: int = 0) -> Tuple[Path, Path]:
    """Writes ``images`` JPEGs of ``height`` x ``width`` under ``folder``/images and their
    COCO json (``num_classes`` categories, ids 1..num_classes, as the model's classes);
    returns (json file, image folder)."""
    generator = torch.Generator().manual_seed(seed)
    image_dir = folder / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    coco = {"images": [], "annotations": [],
            "categories": [{"id": i + 1, "name": f"class{i}"} for i in range(num_classes)]}
    for index in range(images):
        image = smooth_image(generator, height, width)
        file_name = f"{index:05d}.jpg"
        coco["images"].append({"id": index + 1, "file_name": file_name, "height": height,
                               "width": width})
        for box in draw_boxes(image, generator, BOXES_PER_IMAGE):
            category = int(torch.randint(1, num_classes + 1, (1,), generator=generator))
            coco["annotations"].append({"id": len(coco["annotations"]) + 1, "image_id": index + 1,
                                        "category_id": category, "bbox": box,
                                        "area": box[2] * box[3], "iscrowd": 0})
        Image.fromarray(image.numpy()).save(image_dir / file_name, quality=90)
    json_file = folder / "annotations.json"
    json_file.write_text(json.dumps(coco))
    return json_file, image_dir


def write_checkpoint(path: Path, cfg, seed: int = 0) -> Path:
    """Saves ``{"model": state_dict}`` of ``build_model(cfg)`` with weights seeded ``seed``,
    a form MODEL.WEIGHTS reads (``fcos_d2.checkpoint``, detectron2's checkpointer)."""
    from detectron2.modeling import build_model

    torch.manual_seed(seed)
    torch.save({"model": build_model(cfg).state_dict()}, path)
    return path
