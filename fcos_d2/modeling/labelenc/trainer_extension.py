"""What LabelEnc adds to the library trainer (a registered ``TrainerExtension``):

* ``check_config``: ``MODEL.LABELENC`` is valid and its STEP agrees with the META_ARCH;
* ``adjust_config``: step 1's schedule gets the distance-loss warm-up added;
* ``after_load``: step 2, when it starts (not when it resumes), reads the LEF, the head and
  the FPN from the step-1 weights (``MODEL.LABELENC.WEIGHTS``);
* ``test_mapper`` / ``test_model``: a step 1 without detector (``STEP1_DETECTOR False``) is
  scored by its LEF: the head's detections on the LEF's features of the annotated test
  images, labelled "LEF from labels";
* ``hooks``: step 2 also saves its plain FCOS weights after the last iteration.
"""
from typing import List, Tuple

from torch import nn

from ...parallel import unwrap_ddp
from ...trainer_extensions import TrainerExtension, register_trainer_extension
from .config import META_ARCHITECTURES, check_labelenc_config, extend_step1_schedule
from .evaluation import DetectFromLabels, annotated_test_mapper, evaluates_lef
from .hooks import SaveFCOSWeights
from .weights import init_step2_from_step1

LEF_LABEL = "LEF from labels"  # the summary.txt label of a LEF-only step 1's evaluation


class LabelEncTrainerExtension(TrainerExtension):
    """LabelEnc's steps 1 and 2 in the trainer (see the module docstring)."""
    name = "labelenc"
    meta_architectures = tuple(META_ARCHITECTURES.values())

    def applies(self, cfg) -> bool:
        # also a STEP set without its META_ARCH, so that check_config refuses it
        return super().applies(cfg) or cfg.MODEL.LABELENC.STEP != 0

    def check_config(self, cfg) -> None:
        check_labelenc_config(cfg)

    def adjust_config(self, cfg) -> None:
        extend_step1_schedule(cfg)  # step 1: MAX_ITER and STEPS + the distance warm-up

    def after_load(self, model: nn.Module, cfg, *, resuming: bool) -> None:
        if cfg.MODEL.LABELENC.STEP == 2 and not resuming:
            init_step2_from_step1(
                model, cfg.MODEL.LABELENC.WEIGHTS,
                backbone_from_step1=cfg.MODEL.LABELENC.STEP2_BACKBONE == "step1")

    def test_mapper(self, cfg, default):
        return annotated_test_mapper(cfg, type(default)) if evaluates_lef(cfg) else default

    def test_model(self, cfg, model: nn.Module) -> Tuple[nn.Module, str]:
        if evaluates_lef(cfg):
            return DetectFromLabels(unwrap_ddp(model)), LEF_LABEL
        return model, ""

    def hooks(self, cfg) -> List:
        # step 2 also leaves the plain FCOS weights (model_final_fcos.pth) at the end
        return [SaveFCOSWeights(cfg.OUTPUT_DIR)] if cfg.MODEL.LABELENC.STEP == 2 else []


register_trainer_extension(LabelEncTrainerExtension())
