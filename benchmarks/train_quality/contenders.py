"""The contenders of the training-quality benchmark: the ``Contender`` interface, the
one-step contenders (fcos-d2 with ``MODEL.FCOS`` options, torchvision's and detectron2's
FCOS, inference-only variants) and the config overrides that make them.

Every contender gets the protocol's backbone, loader, optimizer, schedule, seeds and
evaluator (``benchmarks.train_quality.protocol``); a contender is what differs on top:
its overrides and the detector it builds. LabelEnc's two-step contenders subclass
``FcosD2Contender`` in ``benchmarks.train_quality.labelenc``; ``catalog`` names them all.
"""
import os
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence

from benchmarks.train_quality import protocol

# The official choices where the recipe differs by its own switches (the recipe's are prior
# 0.1 since 2026-12-03, quality focal and momentum 0.99 since that evening); the recipe
# variants that undo them use them too
PRIOR_001 = ["MODEL.FCOS.PRIOR_PROB", "0.01"]
FOCAL = ["MODEL.FCOS.CLS_LOSS", "focal"]
EMA_MOMENTUM_09 = ["MODEL.FCOS.LOSS_NORMALIZER_EMA_MOMENTUM", "0.9"]  # detectron2's


def center_radius(strides: str) -> List[str]:
    """The override of the center-sampling radius (in strides)."""
    return ["MODEL.FCOS.CENTER_SAMPLING_RADIUS", strides]


# the center radius of the official FCOS, detectron2's and torchvision's (the recipe's is
# 1.0 since 2026-12-03 late); both adapters read MODEL.FCOS.CENTER_SAMPLING_RADIUS
RADIUS_15 = center_radius("1.5")
# The protocol as it was before the recipe moved to P2-P4, AdamW and bf16 (issue 60): FPN
# P3-P7 from res3-res5 (P6/P7 from P5, the recipe's halved ranges), SGD at lr 0.01 with
# weight decay 1e-4 on every parameter, float32. The official formulation, the other
# projects' FCOS and Faster R-CNN keep it, so that their rows stay what was measured.
P3_P7 = ["MODEL.RESNETS.OUT_FEATURES", ["res3", "res4", "res5"],
         "MODEL.FPN.IN_FEATURES", ["res3", "res4", "res5"],
         "MODEL.FCOS.IN_FEATURES", ["p3", "p4", "p5", "p6", "p7"],
         "MODEL.FCOS.TOP_BLOCKS_IN", "p5", "MODEL.FCOS.SIZES_OF_INTEREST", [32, 64, 128, 256],
         "MODEL.FCOS.CHANNELS_LAST", False]
SGD_FP32 = ["SOLVER.OPTIMIZER", "SGD", "SOLVER.BASE_LR", 0.01, "SOLVER.WEIGHT_DECAY", 0.0001,
            "SOLVER.WEIGHT_DECAY_NORM", 0.0001, "SOLVER.WEIGHT_DECAY_BIAS", 0.0001,
            "SOLVER.AMP.ENABLED", False]
PROTOCOL_BEFORE_ISSUE_60 = [*P3_P7, *SGD_FP32]
# The official FCOS choices, stated explicitly so that the ablations below switch one at a
# time whatever the recipe config sets.
OFFICIAL = [*PROTOCOL_BEFORE_ISSUE_60,
    "MODEL.FCOS.SIZES_OF_INTEREST", "[64, 128, 256, 512]",
    "MODEL.FCOS.LOSS_NORMALIZER", "num_pos",
    "MODEL.FCOS.LOC_LOSS_WEIGHTING", "centerness",
    "MODEL.FCOS.REG_ACTIVATION", "",  # the official choice: relu in stride units
    "MODEL.FCOS.USE_SCALE", "True",
    "MODEL.FCOS.IOU_LOSS_SMOOTH", "1.0",
    "MODEL.FCOS.INFERENCE_TH_ON", "probability",
    "MODEL.FCOS.INFERENCE_TH_TEST", "0.05",
    *PRIOR_001, *FOCAL, *RADIUS_15,
    *EMA_MOMENTUM_09,  # with LOSS_NORMALIZER "ema" only
]
# detectron2's gradient clipping (per parameter: L2 norm <= CLIP_VALUE 1.0)
CLIP_GRADIENTS = ["SOLVER.CLIP_GRADIENTS.ENABLED", "True",
                  "SOLVER.CLIP_GRADIENTS.CLIP_TYPE", "norm"]
# overrides shared by variants of OFFICIAL and of the recipe
WARMUP_200 = ["SOLVER.WARMUP_ITERS", "200"]  # a third of REGIME's schedule (its own: 50)
ATSS = ["MODEL.FCOS.ASSIGNER", "atss"]
QUALITY_FOCAL = ["MODEL.FCOS.CLS_LOSS", "quality_focal"]
EMA_MOMENTUM_099 = ["MODEL.FCOS.LOSS_NORMALIZER_EMA_MOMENTUM", "0.99"]
# the quickstart's optimizer (configs/quickstart.yaml), the recipe's since issue 60: AdamW,
# lr 1e-3, decoupled weight decay 0.05, none on norms and biases
ADAMW = ["SOLVER.OPTIMIZER", "ADAMW", "SOLVER.BASE_LR", "0.001", "SOLVER.WEIGHT_DECAY", "0.05",
         "SOLVER.WEIGHT_DECAY_NORM", "0.0", "SOLVER.WEIGHT_DECAY_BIAS", "0.0"]
# fcos-d2 variants: name -> config overrides applied on top of OFFICIAL.
VARIANTS: Dict[str, List[str]] = OrderedDict([
    ("official", []),
    ("ema-normalizer", ["MODEL.FCOS.LOSS_NORMALIZER", "ema"]),
    ("unweighted-box-loss", ["MODEL.FCOS.LOC_LOSS_WEIGHTING", "none"]),
    ("no-scale", ["MODEL.FCOS.USE_SCALE", "False"]),
    ("exp-regression", ["MODEL.FCOS.REG_ACTIVATION", "exp"]),
    ("softplus-regression", ["MODEL.FCOS.REG_ACTIVATION", "softplus"]),
    ("no-iou-smoothing", ["MODEL.FCOS.IOU_LOSS_SMOOTH", "0.0"]),
    ("sizes-halved", ["MODEL.FCOS.SIZES_OF_INTEREST", "[32, 64, 128, 256]"]),
    ("exp+ema+exact-iou", ["MODEL.FCOS.REG_ACTIVATION", "exp", "MODEL.FCOS.LOSS_NORMALIZER", "ema",
                           "MODEL.FCOS.IOU_LOSS_SMOOTH", "0.0"]),
    ("official-param-groups", ["SOLVER.BIAS_LR_FACTOR", "2.0", "SOLVER.WEIGHT_DECAY_BIAS", "0.0"]),
    ("like-detectron2", ["MODEL.FCOS.LOSS_NORMALIZER", "ema", "MODEL.FCOS.LOC_LOSS_WEIGHTING",
                         "none", "MODEL.FCOS.USE_SCALE", "False", "MODEL.FCOS.IOU_LOSS_SMOOTH",
                         "0.0", "MODEL.FCOS.INFERENCE_TH_ON", "final_score",
                         "MODEL.FCOS.INFERENCE_TH_TEST", "0.2"]),
    # issue 20's ablations of the variance: the EMA normalizer's momentum (detectron2: 0.9),
    # the classification prior (official 0.01), a longer warm-up (REGIME: 50), and
    # detectron2's gradient clipping
    ("ema-momentum-0.99", ["MODEL.FCOS.LOSS_NORMALIZER", "ema", *EMA_MOMENTUM_099]),
    ("prior-0.1", ["MODEL.FCOS.PRIOR_PROB", "0.1"]),
    ("warmup-200", WARMUP_200),
    ("clip-gradients", CLIP_GRADIENTS),
    # FCOS-family training improvements (MODEL.FCOS.ASSIGNER, MODEL.FCOS.CLS_LOSS)
    ("atss", ATSS),
    ("quality-focal", QUALITY_FOCAL),
])
RECIPE = "fcos-d2 recipe"  # the config file under REGIME's schedule
# Candidates for a recipe that keeps the mean and loses the spread (issue 20): name ->
# overrides on top of the recipe config (not of OFFICIAL); contender "fcos-d2 recipe+NAME".
# Rows measured on an earlier recipe carry a mark in docs/small_data.md naming what it had then
# ("prior 0.01", "focal", "EMA 0.9", "radius 1.5"): append PRIOR_001, FOCAL,
# EMA_MOMENTUM_09 or RADIUS_15 to the contender's overrides to reproduce them.
RECIPE_VARIANTS: Dict[str, List[str]] = OrderedDict([
    ("atss", ATSS),  # with the recipe's quality focal since 2026-12-03 (evening)
    # ATSS's 8-stride anchors put 10-100 px objects on P3 as the official ranges do; 4
    # strides spread them as the recipe's halved ranges
    ("atss-anchors-4", [*ATSS, "MODEL.FCOS.ATSS_ANCHOR_SCALE", "4.0"]),
    ("clip-gradients", CLIP_GRADIENTS),
    ("warmup-200", WARMUP_200),
    # the long warm-up (the config's until 2026-12-04) with clipping: clipping alone took the
    # official formulation from 7.4 to 11.5 AP, better on every seed
    ("warmup-200+clip-gradients", [*WARMUP_200, *CLIP_GRADIENTS]),
    # twice as long (the config's own 1200 iterations, lr x0.1 at 1000): do the seeds'
    # differences shrink as training gets further?
    ("1200-iterations", ["SOLVER.MAX_ITER", "1200", "SOLVER.STEPS", "(1000,)"]),
    # the recipe's choices of issue 60 undone: SGD (lr 0.01, weight decay 1e-4 on every
    # parameter) in float32, and the former levels P3-P7 (ranges [32, 64, 128, 256])
    ("sgd", SGD_FP32),
    ("p3-p7", P3_P7),
    ("before-issue-60", PROTOCOL_BEFORE_ISSUE_60),  # both: the recipe of 2026-12-05
    # the official classification prior 0.01 (the recipe's is 0.1 since 2026-12-03)
    ("prior-0.01", PRIOR_001),
    # each of the recipe's choices of 2026-12-03 (evening) undone, and both: the recipe of
    # that afternoon ("focal+ema-momentum-0.9"; the "(focal, EMA 0.9)" rows of docs/small_data.md)
    ("focal", FOCAL),
    ("ema-momentum-0.9", EMA_MOMENTUM_09),
    ("focal+ema-momentum-0.9", [*FOCAL, *EMA_MOMENTUM_09]),
    ("warmup-200+ema-momentum-0.9", [*WARMUP_200, *EMA_MOMENTUM_09]),
    # the center region of the positives (2026-12-03, late; the recipe's radius is 1.0
    # strides since then, at most 2x2 locations of a box): the official 1.5 takes up to 3x3,
    # 2.5 up to 5x5 (more examples per image)
    ("center-sampling-1.5", RADIUS_15),
    ("center-sampling-2.5", center_radius("2.5")),
    # smaller still: 0.75 strides keeps at most 2x2 locations too, but often 1 per axis
    ("center-sampling-0.75", center_radius("0.75")),
    # the EMA normalizer slower still: 0.9 -> 0.99 gave +0.8 (focal) and +2.1 (official)
    ("ema-momentum-0.995", ["MODEL.FCOS.LOSS_NORMALIZER_EMA_MOMENTUM", "0.995"]),
])
# A schedule candidate changes every contender's training, not fcos-d2's alone: the same
# change on detectron2's FCOS, contender "detectron2+NAME", tells whether it is the
# recipe's gain or everyone's.
DETECTRON2 = "detectron2"
DETECTRON2_VARIANTS: Dict[str, List[str]] = OrderedDict([
    ("warmup-200", RECIPE_VARIANTS["warmup-200"]),
    ("warmup-200+clip-gradients", RECIPE_VARIANTS["warmup-200+clip-gradients"]),
    ("1200-iterations", RECIPE_VARIANTS["1200-iterations"]),
    ("adamw", ADAMW),
])
TORCHVISION = "torchvision"
# detectron2's two-stage detector on the same trunk (benchmarks.rcnn): the equal-time rows
FASTER_RCNN = "detectron2 faster-rcnn"
# The recipe trained as long as LabelEnc's two steps together (600 + 200 + 600), lr x0.1
# at 5/6 of it as in REGIME: does LabelEnc beat training longer?
SAME_ITERATIONS = "fcos-d2 recipe, LabelEnc's iterations"
SCHEDULES: Dict[str, List] = {
    SAME_ITERATIONS: ["SOLVER.MAX_ITER", 1400, "SOLVER.STEPS", (1167,)],
}
# Variants that change inference only: evaluated on the weights of their base contender's
# runs (same training, so no second one). name -> (base contender, overrides).
EVAL_VARIANTS: Dict[str, tuple] = OrderedDict([
    ("fcos-d2 threshold-final-0.2", ("fcos-d2 official", [
        "MODEL.FCOS.INFERENCE_TH_ON", "final_score", "MODEL.FCOS.INFERENCE_TH_TEST", "0.2"])),
])


class Contender:
    """One detector of the benchmark, trained and evaluated under the protocol.

    What a contender overrides:

    - ``overrides``: config KEY VALUE ... on top of the recipe config and the regime, and
      ``schedule``: schedule keys merged with the protocol's ``REGIME`` before them;
    - ``build(cfg)``: its model on fcos-d2's backbone (the one method a subclass must give);
    - ``run``: only a contender that trains otherwise than once (LabelEnc's two steps).

    ``trained_by`` names the contender whose runs evaluate this one (an inference-only
    variant, never trained itself); ``waits_for`` a contender whose run of the same seed must
    end before this one starts (LabelEnc's step-2 variants start from its step 1).
    """

    trained_by: Optional[str] = None
    waits_for: Optional[str] = None

    def __init__(self, name: str, overrides: Sequence = (), schedule: Sequence = ()):
        self.name, self.overrides, self.schedule = name, list(overrides), list(schedule)

    def build(self, cfg):
        """The detector for `cfg`, on ``cfg.MODEL.DEVICE``."""
        raise NotImplementedError(f"contender {self.name!r}: {type(self).__name__} gives no "
                                  "build(cfg)")

    def config(self, seed: int, output_dir: str, opts: Sequence = (), regime: str = "shapes",
               step: Sequence = ()):
        """Its frozen config for a run of `seed` in `regime` (``protocol.setup_cfg``)."""
        return protocol.setup_cfg(seed, output_dir, regime=regime, schedule=self.schedule,
                                  overrides=self.overrides, step=step, opts=opts)

    def run(self, seed: int, output_dir: str, opts: Sequence, regime: str = "shapes", *,
            diagnostics: bool = False, init_seed: Optional[int] = None,
            step1_from: Optional[str] = None,
            also_evaluate: Sequence["Contender"] = ()) -> List[dict]:
        """Trains it once with `seed` (weights from `init_seed` if given; resuming from
        `output_dir`'s saved state if a killed attempt left one, ``protocol.train``), keeps
        the weights in `output_dir`/model_final.pth and returns its record (contender, COCO
        box metrics, seed, status, final losses, seconds), then one per contender of
        `also_evaluate` (inference-only variants) scored on the same weights."""
        import torch

        cfg = self.config(seed, output_dir, opts, regime)
        model, common = protocol.train(self.build, cfg, seed, diagnostics=diagnostics,
                                       init_seed=init_seed, checkpoint_dir=output_dir)
        if common["status"] != "ok":
            return [{"contender": self.name, "AP": 0.0, "AP50": 0.0, **common}]
        os.makedirs(output_dir, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(output_dir, "model_final.pth"))
        results = [{"contender": self.name, **protocol.evaluate(model, cfg), **common}]
        for variant in also_evaluate:
            variant_cfg = variant.config(seed, output_dir, opts, regime)
            variant_model = variant.build(variant_cfg)
            variant_model.load_state_dict(model.state_dict())
            results.append({"contender": variant.name,
                            **protocol.evaluate(variant_model, variant_cfg), **common})
        return results


class FcosD2Contender(Contender):
    """fcos-d2's FCOS (or, with LabelEnc's step overrides, that step's META_ARCH)."""

    def build(self, cfg):
        from detectron2.modeling import build_model

        return build_model(cfg)  # MODEL.META_ARCHITECTURE: FCOS, or LabelEnc's step


class OtherFCOS(Contender):
    """Another project's FCOS (``TORCHVISION`` or ``DETECTRON2``) behind detectron2's model
    interface (``benchmarks.train_quality.adapters``), with its own center radius."""

    def __init__(self, name: str, project: str, overrides: Sequence = ()):
        if project not in (TORCHVISION, DETECTRON2):
            raise ValueError(f"contender {name!r}: project {project!r} is not one of "
                             f"{[TORCHVISION, DETECTRON2]}")
        super().__init__(name, [*PROTOCOL_BEFORE_ISSUE_60, *RADIUS_15, *overrides])
        self.project = project

    def build(self, cfg):
        from detectron2.modeling import build_backbone

        from benchmarks.train_quality import adapters

        builder = {TORCHVISION: adapters.build_torchvision_fcos,
                   DETECTRON2: adapters.build_detectron2_fcos}[self.project]
        # on MODEL.DEVICE, as detectron2's build_model puts fcos-d2 (`MODEL.DEVICE cuda` at
        # the end of the command line trains every contender on the GPU)
        return builder(cfg, build_backbone(cfg)).to(cfg.MODEL.DEVICE)


# Faster R-CNN's trunk: the ResNet-18 up to res5 it was measured on (its FPN P2-P5, and P6
# for the RPN), also now that the recipe stops at res4 (a larger trunk than the recipe's)
RCNN_TRUNK = ["res3", "res4", "res5"]


class FasterRCNN(Contender):
    """detectron2's Faster R-CNN with FPN (GeneralizedRCNN, RPN, StandardROIHeads;
    ``benchmarks.rcnn.faster_rcnn_overrides``) on the ResNet-18 trunk up to res5
    (``RCNN_TRUNK``), with the protocol's data, schedule and evaluator, SGD and float32 as
    it was measured (``SGD_FP32``); its FPN starts at res2 (P2-P6), as detectron2's FPN
    models do."""

    def config(self, seed: int, output_dir: str, opts: Sequence = (), regime: str = "shapes",
               step: Sequence = ()):
        """The protocol's config with the R-CNN keys for its trunk and the regime's class
        count; the command's `opts` last, as for every contender."""
        from benchmarks.rcnn import faster_rcnn_overrides, register_trunk_fpn_backbone

        register_trunk_fpn_backbone()
        cfg = super().config(seed, output_dir, opts, regime, step).clone()
        cfg.defrost()
        cfg.merge_from_list(SGD_FP32)  # as measured before the recipe's move (P3_P7)
        cfg.merge_from_list(faster_rcnn_overrides(RCNN_TRUNK, cfg.MODEL.FCOS.NUM_CLASSES))
        cfg.merge_from_list(list(opts))
        cfg.freeze()
        return cfg

    def build(self, cfg):
        from detectron2.modeling import build_model

        return build_model(cfg)  # on MODEL.DEVICE


class InferenceVariant(FcosD2Contender):
    """fcos-d2 `base` with inference options `overrides`: scored on the weights of `base`'s
    runs (the same training, so no second one)."""

    def __init__(self, name: str, base: Contender, overrides: Sequence):
        super().__init__(name, [*base.overrides, *overrides], base.schedule)
        self.trained_by = base.name
