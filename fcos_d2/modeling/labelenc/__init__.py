"""LabelEnc (Hao et al., 2020, "LabelEnc: A New Intermediate Supervision Method for Object
Detection"; public code megvii-model/LabelEnc): a two-step training of FCOS whose result
is a plain FCOS.

* ``label_map``: ground-truth boxes as a K-channel map;
* ``encoder``: the label-encoding function (LEF) with its FPN;
* ``distance``: the training-only adapter and the feature distance;
* ``meta_arch``: the step-1 and step-2 models, the registered META_ARCHs "LabelEncStep1"
  and "LabelEncStep2" (``MODEL.LABELENC.STEP`` must agree);
* ``weights``: step 1 -> step 2, the official step-1 file, the plain FCOS weights;
* ``hooks``: the trainer hook that saves step 2's plain FCOS weights;
* ``evaluation``: scoring a LEF-only step 1 by its LEF;
* ``config``: the ``MODEL.LABELENC`` node;
* ``trainer_extension``: what LabelEnc adds to the library trainer (registered).

Importing it registers the META_ARCHs, the config node and the trainer extension.
"""
from .config import add_labelenc_config, check_labelenc_config, extend_step1_schedule
from .evaluation import DetectFromLabels, annotated_test_mapper, evaluates_lef
from .hooks import SaveFCOSWeights
from .meta_arch import LabelEncStep1, LabelEncStep2
from .trainer_extension import LabelEncTrainerExtension
from .weights import convert_official_labelenc, fcos_state_dict, init_step2_from_step1

__all__ = ["add_labelenc_config", "check_labelenc_config", "extend_step1_schedule",
           "DetectFromLabels", "annotated_test_mapper", "evaluates_lef",
           "SaveFCOSWeights", "LabelEncStep1", "LabelEncStep2", "LabelEncTrainerExtension",
           "convert_official_labelenc", "fcos_state_dict", "init_step2_from_step1"]
