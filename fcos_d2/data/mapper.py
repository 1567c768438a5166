"""The dataset mapper of training, evaluation and ``--vis-val``: detectron2's
``DatasetMapper`` reading images with ``fcos_d2.data.images.read_image``.

That reader scales 16-bit PNGs to 8 bits (detectron2 clips them to white) and names the
file and image id of a file it cannot decode; an image whose width and height are swapped
with respect to its annotation (an EXIF-rotated photo annotated as stored) gets an error
that says so. Everything else is ``DatasetMapper``'s:
``from_config``, augmentations, box (and, where enabled, mask and keypoint) annotations,
precomputed proposals. Semantic segmentation ("sem_seg_file_name") is not read: FCOS has
no use for it.

Instance masks (``MODEL.MASK_ON``, detectron2's key for the mapper's masks): each non-crowd
annotation's "segmentation" (COCO polygons, or RLE as ``pycocotools`` or
``load_coco_json`` give it) goes through the same augmentations as the image and becomes
``instances.gt_masks`` at the input size: ``PolygonMasks`` or ``BitMasks`` by
``INPUT.MASK_FORMAT`` ("polygon" or "bitmask"). RLE cannot become polygons without loss, so
RLE data with "polygon" is an error that says to use "bitmask"; so is an annotation without
a segmentation.
"""
import copy
from typing import List, Tuple, Union

import numpy as np
import torch
from detectron2.data import DatasetMapper
from detectron2.data import detection_utils as utils
from detectron2.data import transforms as T
from detectron2.structures import BitMasks, Instances, PolygonMasks

from .images import read_image

__all__ = ["FCOSDatasetMapper", "MASK_FORMATS"]

MASK_FORMATS = ("polygon", "bitmask")  # INPUT.MASK_FORMAT: PolygonMasks or BitMasks


class FCOSDatasetMapper(DatasetMapper):
    """``DatasetMapper`` with ``fcos_d2.data.images.read_image``; same arguments, same output:

    ``"image"``: (C, H, W) uint8 tensor in ``INPUT.FORMAT`` after augmentation, plus, in
    training, ``"instances"`` (gt_boxes, gt_classes, and gt_masks with ``MODEL.MASK_ON``)
    of the non-crowd annotations.
    """

    @classmethod
    def from_config(cls, cfg, is_train: bool = True):
        if cfg.INPUT.MASK_FORMAT not in MASK_FORMATS:
            raise ValueError(f"INPUT.MASK_FORMAT: unknown value '{cfg.INPUT.MASK_FORMAT}'; "
                             f"use one of {list(MASK_FORMATS)}")
        return super().from_config(cfg, is_train)

    def __call__(self, dataset_dict: dict) -> dict:
        dataset_dict = copy.deepcopy(dataset_dict)  # modified below
        image = read_image(dataset_dict["file_name"], format=self.image_format,
                           image_id=dataset_dict.get("image_id"))
        _check_image_size(dataset_dict, image)
        aug_input = T.AugInput(image)
        transforms = self.augmentations(aug_input)
        image = aug_input.image
        image_shape = image.shape[:2]  # (H, W)
        # (H, W, C) -> (C, H, W); a tensor travels through the loader's shared memory
        dataset_dict["image"] = torch.as_tensor(np.ascontiguousarray(image.transpose(2, 0, 1)))
        dataset_dict.pop("sem_seg_file_name", None)
        if self.proposal_topk is not None:
            utils.transform_proposals(dataset_dict, image_shape, transforms,
                                      proposal_topk=self.proposal_topk)
        annotations = dataset_dict.pop("annotations", None)
        if self.is_train and annotations is not None:
            where = f"image file {dataset_dict['file_name']} (image id " \
                    f"{dataset_dict.get('image_id')})"
            dataset_dict["instances"] = self._instances(annotations, transforms, image_shape,
                                                        where=where)
        return dataset_dict

    def _instances(self, annotations, transforms, image_shape, *, where: str) -> Instances:
        """The non-crowd annotations, transformed, as Instances without empty boxes.
        ``where``: the image, as errors name it."""
        for annotation in annotations:
            if not self.use_instance_mask:
                annotation.pop("segmentation", None)
            if not self.use_keypoint:
                annotation.pop("keypoints", None)
        annotations = [a for a in annotations if a.get("iscrowd", 0) == 0]
        if self.use_instance_mask:
            _check_segmentations(annotations, self.instance_mask_format, where)
        transformed = [
            utils.transform_instance_annotations(
                a, transforms, image_shape, keypoint_hflip_indices=self.keypoint_hflip_indices)
            for a in annotations
        ]
        instances = utils.annotations_to_instances(
            transformed, image_shape, mask_format=self.instance_mask_format)
        if self.use_instance_mask and not instances.has("gt_masks"):  # no annotation
            instances.gt_masks = _no_masks(self.instance_mask_format, image_shape)
        if self.recompute_boxes:  # tight boxes of the masks after cropping
            instances.gt_boxes = instances.gt_masks.get_bounding_boxes()
        return utils.filter_empty_instances(instances)


def _check_segmentations(annotations: List[dict], mask_format: str, where: str) -> None:
    """Raises a ValueError naming the image when an annotation has no segmentation, or an
    RLE one while the masks are to be polygons."""
    for annotation in annotations:
        segmentation = annotation.get("segmentation")
        if segmentation is None:
            raise ValueError(f"MODEL.MASK_ON: an annotation of {where} has no "
                             "'segmentation'; give every annotation a mask, or train without "
                             "masks (MODEL.MASK_ON False)")
        if isinstance(segmentation, dict) and mask_format == "polygon":
            raise ValueError(f"INPUT.MASK_FORMAT 'polygon': {where} has an RLE segmentation, "
                             "which polygons cannot hold exactly; set INPUT.MASK_FORMAT "
                             "bitmask")


def _no_masks(mask_format: str, image_shape: Tuple[int, int]) -> Union[BitMasks, PolygonMasks]:
    """Zero masks of an image without annotations, so that gt_masks always exists."""
    if mask_format == "polygon":
        return PolygonMasks([])
    return BitMasks(torch.zeros((0, *image_shape), dtype=torch.bool))  # (0, H, W)


def _check_image_size(dataset_dict: dict, image: np.ndarray) -> None:
    """detectron2's ``check_image_size``, saying what to do when width and height are
    swapped: the sign of an EXIF-rotated photo annotated as stored."""
    try:
        utils.check_image_size(dataset_dict, image)
    except utils.SizeMismatchError as e:
        if (dataset_dict.get("width"), dataset_dict.get("height")) != image.shape[:2]:
            raise
        raise utils.SizeMismatchError(
            f"{e} (image id {dataset_dict.get('image_id')}) Width and height are swapped: the "
            "file's EXIF orientation turns it by 90 degrees, and images are loaded as "
            "displayed. If the annotations describe the stored, unturned pixels, remove the "
            "EXIF orientation tag from the file; if they describe the displayed image, correct "
            "its width and height in the annotation file.") from e
