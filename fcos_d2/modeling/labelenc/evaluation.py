"""Scoring what step 1's LEF encodes: the head's detections on the LEF's features of each
image's own ground truth (``detect_from_labels``), read by a loader that keeps the
annotations at the test size. The evaluation of a LEF-only step 1
(``MODEL.LABELENC.STEP1_DETECTOR False``), whose detector never trains."""
from detectron2.data import DatasetMapper
from detectron2.data import transforms as T
from torch import nn


def evaluates_lef(cfg) -> bool:
    """Whether ``cfg``'s training model is scored by its LEF: a step 1 without detector."""
    return cfg.MODEL.LABELENC.STEP == 1 and not cfg.MODEL.LABELENC.STEP1_DETECTOR


class DetectFromLabels(nn.Module):
    """A LabelEnc model whose call is its ``detect_from_labels``, for detectron2's
    ``inference_on_dataset``; inputs need "instances" (``annotated_test_mapper``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batched_inputs):
        return self.model.detect_from_labels(batched_inputs)


def annotated_test_mapper(cfg, mapper_class=DatasetMapper) -> DatasetMapper:
    """`mapper_class` resizing as at test time (INPUT.MIN_SIZE_TEST / MAX_SIZE_TEST, no
    flip) and keeping the annotations as "instances"."""
    resize = T.ResizeShortestEdge(cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST, "choice")
    return mapper_class(cfg, is_train=True, augmentations=[resize])
