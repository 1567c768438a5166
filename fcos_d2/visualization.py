"""Pictures and JSON files of detections, for ``demo/demo.py`` and ``train_net.py --vis-val``.

For an image called ``<name>``, ``save_detections`` writes ``<name>.png`` (the image with
boxes, class names and scores drawn by detectron2's Visualizer, and the masks of a model
that returns ``pred_masks``) and ``<name>.json``::

    {"image": "<path>", "height": H, "width": W,
     "detections": [{"box_xyxy": [x0, y0, x1, y1], "score": s, "class_id": k,
                     "class_name": "...", "mask_rle": {"size": [H, W], "counts": "..."}},
                    ...]}

Boxes are absolute pixels of the original image; class ids are 0-based. "mask_rle" is there
only for models with masks: the (H, W) mask as COCO compressed RLE
(``pycocotools.mask.decode`` reads it).
"""
import json
import os
from typing import Iterable, List, Optional, Sequence

import numpy as np
import torch
from PIL import Image
from detectron2.evaluation import inference_context
from detectron2.structures import Instances
from detectron2.utils.file_io import PathManager

from .data.images import read_image
from .data.masks import mask_to_rle

__all__ = ["detections_to_dicts", "draw_detections", "save_detections",
           "save_loader_predictions"]


def detections_to_dicts(instances: Instances,
                        class_names: Optional[Sequence[str]] = None) -> List[dict]:
    """Detections as JSON-ready dicts.

    Args:
        instances: predictions with ``pred_boxes`` (XYXY), ``scores`` and ``pred_classes``,
            and optionally ``pred_masks`` (R, H, W).
        class_names: names of the 0-based classes; an id without a name is named by its id.

    Returns:
        One dict per detection: "box_xyxy", "score", "class_id", "class_name", and
        "mask_rle" (COCO compressed RLE, the counts a string) when there are masks.
    """
    names = list(class_names or [])
    boxes = instances.pred_boxes.tensor.tolist()
    scores, classes = instances.scores.tolist(), instances.pred_classes.tolist()
    found = [{"box_xyxy": box, "score": score, "class_id": k,
              "class_name": names[k] if k < len(names) else str(k)}
             for box, score, k in zip(boxes, scores, classes)]
    if instances.has("pred_masks"):
        for detection, mask in zip(found, instances.pred_masks.cpu().numpy()):
            detection["mask_rle"] = mask_to_rle(mask)
    return found


def draw_detections(image_rgb: np.ndarray, instances: Instances, metadata,
                    min_side: int = 512) -> np.ndarray:
    """Draws boxes, class names and scores (and masks, if any) on a copy of an image.

    Args:
        image_rgb: (H, W, 3) uint8, RGB.
        instances: predictions in the image's pixels.
        metadata: detectron2 Metadata; its ``thing_classes`` name the classes.
        min_side: small images are enlarged to this shorter side, so labels stay legible.

    Returns:
        (H', W', 3) uint8 RGB picture, H' = H * s, W' = W * s with s = max(1, min_side / min(H, W)).
    """
    # imported here: detectron2's Visualizer imports matplotlib (about 1 s of every
    # train_net.py start, and of each worker spawned, where nothing is drawn)
    from detectron2.utils.visualizer import Visualizer

    scale = max(1.0, min_side / min(image_rgb.shape[:2]))
    visualizer = Visualizer(image_rgb, metadata, scale=scale)
    return visualizer.draw_instance_predictions(instances.to("cpu")).get_image()


def save_detections(image_rgb: np.ndarray, instances: Instances, metadata, output_dir: str,
                    name: str, image_path: str = "") -> List[str]:
    """Writes ``<output_dir>/<name>.png`` (``draw_detections``) and ``<name>.json``.

    Args:
        image_rgb: (H, W, 3) uint8 RGB image the detections belong to.
        instances: the detections to draw and list (already filtered by score).
        metadata: detectron2 Metadata with ``thing_classes``.
        output_dir: created if missing.
        name: file name without extension.
        image_path: recorded in the JSON as "image".

    Returns:
        The paths of the picture and of the JSON file.
    """
    PathManager.mkdirs(output_dir)
    picture = os.path.join(output_dir, name + ".png")
    Image.fromarray(draw_detections(image_rgb, instances, metadata)).save(picture)
    record = {"image": image_path, "height": image_rgb.shape[0], "width": image_rgb.shape[1],
              "detections": detections_to_dicts(instances, metadata.get("thing_classes", None))}
    listing = os.path.join(output_dir, name + ".json")
    with PathManager.open(listing, "w") as f:
        json.dump(record, f, indent=1)
    return [picture, listing]


def save_loader_predictions(model: torch.nn.Module, data_loader: Iterable[List[dict]], metadata,
                            output_dir: str, max_images: int, score_threshold: float = 0.5
                            ) -> List[str]:
    """Runs ``model`` on the first ``max_images`` images of a detectron2 test loader and
    saves each with ``save_detections``, named after its file.

    Args:
        model: a detectron2 model; its training mode is restored afterwards.
        data_loader: yields lists of dataset dicts with "file_name", as
            ``build_detection_test_loader`` does.
        metadata: detectron2 Metadata of the dataset.
        output_dir: where the files go.
        max_images: how many images to save.
        score_threshold: detections below this score are left out.

    Returns:
        The paths written.
    """
    written, saved = [], 0
    with inference_context(model), torch.no_grad():
        for inputs in data_loader:
            if saved >= max_images:
                break
            for item, output in zip(inputs[:max_images - saved], model(inputs)):
                instances = output["instances"].to("cpu")
                image = read_image(item["file_name"], format="RGB", image_id=item.get("image_id"))
                name = os.path.splitext(os.path.basename(item["file_name"]))[0]
                written += save_detections(image, instances[instances.scores >= score_threshold],
                                           metadata, output_dir, name, item["file_name"])
                saved += 1
    return written
