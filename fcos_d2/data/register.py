"""Custom COCO-format datasets: registration with up-front checks, and the class count check.

``train_net.py --register-coco NAME ANNOTATIONS.json IMAGE_DIR`` calls
``register_coco_dataset``; ``check_num_classes`` compares the datasets a config trains or
tests on with ``MODEL.FCOS.NUM_CLASSES`` (which counts foreground classes only).
"""
import functools
import os
from typing import Iterable, List, Union

from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import load_coco_json, register_coco_instances

from .boxes import dropping_invalid_boxes


def register_coco_dataset(name: str, json_file: str, image_root: str) -> None:
    """Registers a COCO-format dataset under `name`, checking its paths first.

    Loading it (``DatasetCatalog.get(name)``) also checks that every image it lists exists,
    and drops the boxes that cannot be trained on (``fcos_d2.data.boxes``) with a warning.

    Args:
        name: the new dataset name, used in ``DATASETS.TRAIN`` / ``DATASETS.TEST``.
        json_file: path to the COCO annotation file.
        image_root: folder the annotation file's ``file_name`` entries are relative to.

    Raises:
        ValueError: `name` is already registered.
        FileNotFoundError: `json_file` or `image_root` does not exist.
    """
    if name in DatasetCatalog.list():
        raise ValueError(f"dataset '{name}' is already registered; register the COCO "
                         "dataset under another name")
    if not os.path.isfile(json_file):
        raise FileNotFoundError(f"dataset '{name}': annotation file {json_file} not found")
    if not os.path.isdir(image_root):
        raise FileNotFoundError(f"dataset '{name}': image directory {image_root} not found")
    # register_coco_instances sets the metadata COCOEvaluator reads (json_file, image_root,
    # evaluator_type); its loader is then swapped for one that also checks the image files
    # and drops the boxes that cannot be trained on.
    register_coco_instances(name, {}, json_file, image_root)
    DatasetCatalog.remove(name)
    DatasetCatalog.register(name, dropping_invalid_boxes(
        name, functools.partial(load_checked_coco_json, name, json_file, image_root)))


def load_checked_coco_json(name: str, json_file: str, image_root: str) -> List[dict]:
    """``load_coco_json`` (which fills the metadata's ``thing_classes``), then checks that
    every listed image file exists.

    Raises:
        FileNotFoundError: naming the first missing image, its image id and how many are
            missing in all.
    """
    dataset_dicts = load_coco_json(json_file, image_root, name)
    missing = [d for d in dataset_dicts if not os.path.isfile(d["file_name"])]
    if missing:
        first = missing[0]
        more = f"; {len(missing) - 1} more images are missing" if len(missing) > 1 else ""
        raise FileNotFoundError(
            f"dataset '{name}': image file {os.path.relpath(first['file_name'], image_root)} "
            f"not found in {image_root} (listed in {json_file}, image id "
            f"{first['image_id']}){more}")
    return dataset_dicts


def check_num_classes(dataset_names: Union[str, Iterable[str]], num_classes: int) -> None:
    """Checks that each dataset has exactly `num_classes` classes.

    A dataset whose metadata has no ``thing_classes`` yet is loaded first (loading a COCO
    json fills them).

    Args:
        dataset_names: registered dataset names (or one name).
        num_classes: the config's ``MODEL.FCOS.NUM_CLASSES``.

    Raises:
        ValueError: naming the dataset, both numbers and the config key to change.
    """
    names = [dataset_names] if isinstance(dataset_names, str) else list(dataset_names)
    for name in names:
        if MetadataCatalog.get(name).get("thing_classes") is None:
            DatasetCatalog.get(name)
        classes = MetadataCatalog.get(name).get("thing_classes")
        if classes is None:
            raise ValueError(f"dataset '{name}' has no thing_classes in its metadata, so "
                             f"MODEL.FCOS.NUM_CLASSES ({num_classes}) cannot be checked")
        if len(classes) != num_classes:
            raise ValueError(
                f"dataset '{name}' has {len(classes)} classes but MODEL.FCOS.NUM_CLASSES is "
                f"{num_classes}; set MODEL.FCOS.NUM_CLASSES {len(classes)}")
