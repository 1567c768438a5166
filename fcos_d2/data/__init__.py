"""Datasets: the built-in synthetic shapes set, custom COCO-format datasets, invalid boxes
dropped at loading (``boxes``), and the image reader and mapper of the data loaders
(``images``, ``mapper``).

Importing this package registers ``synthetic_shapes_train`` and ``synthetic_shapes_val``,
and their twins with instance masks ``synthetic_masks_train`` and ``synthetic_masks_val``,
with detectron2, and the thin-shapes set ``synthetic_thin_train`` and ``synthetic_thin_val``
and its twins with masks ``synthetic_thin_masks_train`` and ``synthetic_thin_masks_val``
(``synthetic_thin``) (nothing is generated until they are first loaded or prepared).
"""
from . import synthetic, synthetic_thin
from .boxes import drop_invalid_boxes, filter_invalid_boxes_on_load
from .images import UnreadableImageError, read_image
from .mapper import FCOSDatasetMapper
from .register import check_num_classes, register_coco_dataset
from .synthetic import ensure_synthetic_shapes

# Side effect: registers the synthetic names; skips names already registered, so a second
# import (or a reload) is harmless.
synthetic.register_synthetic_shapes()
synthetic_thin.register_synthetic_thin()  # synthetic_thin[_masks]_train/val

__all__ = ["FCOSDatasetMapper", "UnreadableImageError", "check_num_classes",
           "drop_invalid_boxes", "ensure_synthetic_shapes", "filter_invalid_boxes_on_load",
           "prepare_dataset", "read_image", "register_coco_dataset"]


def prepare_dataset(name: str) -> None:
    """Makes sure the files of dataset `name` exist before anything reads them.

    Generates the synthetic shapes split when `name` is one of ours (``COCOEvaluator``
    reads ``json_file`` when it is built, before any data is loaded); does nothing for any
    other name.

    Args:
        name: a registered dataset name, e.g. ``"synthetic_shapes_val"``.
    """
    if synthetic.is_synthetic(name):
        synthetic.prepare_synthetic_shapes(name)
    elif synthetic_thin.is_synthetic_thin(name):
        synthetic_thin.prepare_synthetic_thin(name)
