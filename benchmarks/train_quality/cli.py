#!/usr/bin/env python
"""Training-quality benchmark: FCOS implementations trained from scratch on small data.

The regime: the first 400 images of the built-in synthetic shapes train split (6
classes, 128 x 128, boxes of 8-124 px, used at their own size), evaluated with COCO box AP
on the first 100 val images. The model and optimizer are those of
``configs/FCOS-R18-small-data.yaml``: ResNet-18 with BN from scratch, FPN P3-P7 (P6/P7
from P5), a 128-channel GN head with 4 convs per tower, random flip, SGD (momentum 0.9,
weight decay 1e-4 on every parameter), batch 4, lr 0.01; the schedule (``REGIME``, for
every contender) is half the config's length: 600 iterations, lr x0.1 at 500, and the
linear warm-up of 50 iterations the protocol has always had (the config's 100 of 1200,
scaled; its warm-up of a third of the schedule until 2026-12-04 is contender
``fcos-d2 recipe+warmup-200``), so that a run takes
about 4 minutes on one CPU core. Relative to the strides, the objects are as large
as 10-100 px objects in 256-352 px images.

The second regime (``--regime thin``, ``REGIMES``): the 400 train and 100 val images of
``fcos_d2.data.synthetic_thin`` (10 classes of thin outlines, crosses and line-drawn glyphs
as well as filled shapes, objects of 10-100 px in images of 256 x 256-352 px, each used at
its own size), the same model, optimizer and schedule, 5 seeds by default; its results go
to their own folder (``output/train_quality_thin``) and carry "regime": "thin", and a
results file of one regime is refused for the other.

Every contender gets the same backbone (built by fcos-d2's backbone builder), data
loader, optimizer, schedule, seeds and evaluator; only the detector on top differs:

- ``fcos-d2 <variant>``: fcos-d2 with ``MODEL.FCOS`` options (``VARIANTS``);
- ``torchvision``: ``torchvision.models.detection.FCOS`` on the same backbone;
- ``detectron2``: detectron2's built-in FCOS (``detectron2.modeling.meta_arch.fcos``,
  unregistered, in v0.6 and main), where the installed detectron2 has it;
  ``detectron2+<variant>`` with a schedule change (``DETECTRON2_VARIANTS``).

Each (contender, seed) runs in its own process with one thread; ``--jobs`` run at once.
With ``MODEL.DEVICE cuda`` at the end of the command, every contender trains and is
evaluated on the GPU (the ``--jobs`` runs share it; data loading and COCO evaluation stay
on one CPU thread each).
Results are appended to ``OUTPUT/results.jsonl`` (runs found there are not repeated), and
the table (mean, sample std and range of AP over seeds) is printed and written to
``OUTPUT/table.md``.

Usage:
    python tools/train_quality.py [--regime shapes|thin] [--contenders all|NAME ...]
                                  [--seeds 0 1 2] [--jobs 2] [--output DIR] [--diagnostics]
                                  [KEY VALUE ...]
    python tools/train_quality.py --regime thin --jobs 10 MODEL.DEVICE cuda  # on a GPU
    python tools/train_quality.py --list
    python tools/train_quality.py --labelenc-cost 20   # seconds per training iteration
    python tools/train_quality.py --regime-cost 10     # the same, per regime
    python tools/train_quality.py --regime thin --positives  # positives per level
    python tools/train_quality.py --regime thin --reevaluate 500  # stored runs, 500 more
                                                                  # validation images
    python tools/train_quality.py --regime thin --weight-growth  # stored runs' weight norms
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CONFIG = REPO / "configs" / "FCOS-R18-small-data.yaml"
# Half the recipe's 1200 iterations, so that a run takes a few minutes on one CPU core; the
# warm-up stays the protocol's 50 for every contender, as in every table measured with it.
REGIME = ["SOLVER.MAX_ITER", 600, "SOLVER.STEPS", (500,), "SOLVER.WARMUP_ITERS", 50]
TRAIN_IMAGES, VAL_IMAGES = 400, 100
TRAIN_NAME, VAL_NAME = "train_quality_shapes_train", "train_quality_shapes_val"
# (dataset name, synthetic split, first images taken)
DATASETS = ((TRAIN_NAME, "train", TRAIN_IMAGES), (VAL_NAME, "val", VAL_IMAGES))


@dataclass(frozen=True)
class Regime:
    """A benchmark regime: its data (from the synthetic generator ``generator``), the
    config overrides its data needs on top of the recipe config, its default seeds and
    its default output folder (under output/)."""

    datasets: Tuple[Tuple[str, str, int], ...]  # (registered name, split, first images)
    generator: str  # "shapes" (fcos_d2.data.synthetic) or "thin" (.synthetic_thin)
    overrides: Tuple = ()
    seeds: Tuple[int, ...] = (0, 1, 2)
    output: str = "train_quality"


REGIMES: Dict[str, Regime] = {
    # 128-px shapes, 6 classes (the first table of the README)
    "shapes": Regime(DATASETS, "shapes"),
    # 256-352 px images, 10 classes of thin and filled objects of 10-100 px, each image
    # at its own size: closer to the held-out data of issue 20
    "thin": Regime((("train_quality_thin_train", "train", TRAIN_IMAGES),
                    ("train_quality_thin_val", "val", VAL_IMAGES)), "thin",
                   ("MODEL.FCOS.NUM_CLASSES", 10, "INPUT.MIN_SIZE_TRAIN", (256,),
                    "INPUT.MAX_SIZE_TRAIN", 352, "INPUT.MIN_SIZE_TEST", 256,
                    "INPUT.MAX_SIZE_TEST", 352), (0, 1, 2, 3, 4), "train_quality_thin"),
}

# The official choices where the recipe differs by its own switches (the recipe's are prior
# 0.1 since 2026-12-03, quality focal and momentum 0.99 since that evening); the recipe
# variants that undo them use them too
PRIOR_001 = ["MODEL.FCOS.PRIOR_PROB", "0.01"]
FOCAL = ["MODEL.FCOS.CLS_LOSS", "focal"]
EMA_MOMENTUM_09 = ["MODEL.FCOS.LOSS_NORMALIZER_EMA_MOMENTUM", "0.9"]  # detectron2's


def centre_radius(strides: str) -> List[str]:
    """The override of the centre-sampling radius (in strides)."""
    return ["MODEL.FCOS.CENTER_SAMPLING_RADIUS", strides]


# the centre radius of the official FCOS, detectron2's and torchvision's (the recipe's is
# 1.0 since 2026-12-03 late); both adapters read MODEL.FCOS.CENTER_SAMPLING_RADIUS
RADIUS_15 = centre_radius("1.5")
# The official FCOS choices, stated explicitly so that the ablations below switch one at a
# time whatever the recipe config sets.
OFFICIAL = [
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
# fcos-d2 variants: name -> config overrides applied on top of OFFICIAL.
VARIANTS: Dict[str, List[str]] = OrderedDict([
    ("official", []),
    ("ema-normaliser", ["MODEL.FCOS.LOSS_NORMALIZER", "ema"]),
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
    # issue 20's ablations of the variance: the EMA normaliser's momentum (detectron2: 0.9),
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
# Rows measured on an earlier recipe carry a mark in the README naming what it had then
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
    # the quickstart's optimizer (configs/quickstart.yaml), which took SipMask's quickstart
    # from 23.4 to 48.1 box AP: AdamW, lr 1e-3, decoupled weight decay 0.05, none on norms
    # and biases (the recipe's biases already train at the base lr); batch and schedule stay
    ("adamw", ["SOLVER.OPTIMIZER", "ADAMW", "SOLVER.BASE_LR", "0.001",
               "SOLVER.WEIGHT_DECAY", "0.05", "SOLVER.WEIGHT_DECAY_NORM", "0.0",
               "SOLVER.WEIGHT_DECAY_BIAS", "0.0"]),
    # the official classification prior 0.01 (the recipe's is 0.1 since 2026-12-03)
    ("prior-0.01", PRIOR_001),
    # each of the recipe's choices of 2026-12-03 (evening) undone, and both: the recipe of
    # that afternoon ("focal+ema-momentum-0.9"; the README's "(focal, EMA 0.9)" rows)
    ("focal", FOCAL),
    ("ema-momentum-0.9", EMA_MOMENTUM_09),
    ("focal+ema-momentum-0.9", [*FOCAL, *EMA_MOMENTUM_09]),
    ("warmup-200+ema-momentum-0.9", [*WARMUP_200, *EMA_MOMENTUM_09]),
    # the centre region of the positives (2026-12-03, late; the recipe's radius is 1.0
    # strides since then, at most 2x2 locations of a box): the official 1.5 takes up to 3x3,
    # 2.5 up to 5x5 (more examples per image)
    ("center-sampling-1.5", RADIUS_15),
    ("center-sampling-2.5", centre_radius("2.5")),
    # smaller still: 0.75 strides keeps at most 2x2 locations too, but often 1 per axis
    ("center-sampling-0.75", centre_radius("0.75")),
    # the EMA normaliser slower still: 0.9 -> 0.99 gave +0.8 (focal) and +2.1 (official)
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
    ("adamw", RECIPE_VARIANTS["adamw"]),
])
# LabelEnc (fcos_d2/modeling/labelenc) on the recipe: step 1 with the distance-loss warm-up
# added to REGIME (a third of it, as the official 30000 of 90000), then step 2 with REGIME
# and the auxiliary loss for 8/9 of it (the official 80000 of 90000); one run does both,
# step 2 starting from that seed's step 1. LEF width 16: res3-res5 as ResNet-18's.
LABELENC = "fcos-d2 recipe+LabelEnc"
LABELENC_WARMUP, LABELENC_AUXILIARY = 200, 533
LABELENC_STEPS = {
    1: ["MODEL.LABELENC.STEP", 1, "MODEL.LABELENC.LEF_WIDTH", 16,
        "MODEL.LABELENC.DISTANCE_LOSS_WARMUP_ITERS", LABELENC_WARMUP],
    2: ["MODEL.LABELENC.STEP", 2, "MODEL.LABELENC.LEF_WIDTH", 16,
        "MODEL.LABELENC.AUXILIARY_LOSS_ITERS", LABELENC_AUXILIARY],
}
# Contenders that run both steps: name -> overrides of their step 1. The LEF-only step 1
# (MODEL.LABELENC.STEP1_DETECTOR False): the LEF and the head learn alone for REGIME's
# iterations, then the official step 2. Sharing its head with a detector from scratch,
# the LEF of the official step 1 ends up detecting poorly from the labels themselves
# (the records' "step1_lef_AP").
LABELENC_LEF_ONLY = "fcos-d2 recipe+LabelEnc, LEF-only step 1"
STEP1_VARIANTS: Dict[str, List] = OrderedDict([
    (LABELENC, []),
    (LABELENC_LEF_ONLY, ["MODEL.LABELENC.STEP1_DETECTOR", False,
                         "MODEL.LABELENC.DISTANCE_LOSS_WARMUP_ITERS", 0]),
])
# Step-2 variants, from the step 1 of LABELENC's run with the same seed: name -> overrides.
# Without the auxiliary loss, step 2 differs from the recipe only by its start (head and FPN
# from step 1): how much of LabelEnc's gain is that start? From scratch, the official step 2
# throws away the backbone step 1 trained (it would start from ImageNet weights): starting
# it from step 1's detector instead, with and without the auxiliary loss.
STEP2_FROM_DETECTOR = ["MODEL.LABELENC.STEP2_BACKBONE", "step1"]
STEP2_VARIANTS: Dict[str, List] = OrderedDict([
    ("fcos-d2 recipe+LabelEnc, step 2 without auxiliary loss",
     ["MODEL.LABELENC.AUXILIARY_LOSS_ITERS", 0]),
    ("fcos-d2 recipe+LabelEnc, step 2 from step 1's detector", STEP2_FROM_DETECTOR),
    ("fcos-d2 recipe+LabelEnc, step 2 from step 1's detector without auxiliary loss",
     [*STEP2_FROM_DETECTOR, "MODEL.LABELENC.AUXILIARY_LOSS_ITERS", 0]),
    # the auxiliary loss is worth +0.7 at weight 1: does more of it help more?
    ("fcos-d2 recipe+LabelEnc, step 2 with auxiliary loss weight 4",
     ["MODEL.LABELENC.AUXILIARY_LOSS_WEIGHT", 4.0]),
])
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


# Contenders added with regime 2: in "all" of --regime thin only, so that "all" of
# --regime shapes (make train-quality) stays the measured table; by name in both.
ADDED_WITH_THIN = [f"fcos-d2 {v}" for v in ("ema-momentum-0.99", "prior-0.1", "warmup-200",
                                             "clip-gradients", "atss", "quality-focal")] \
    + [f"{RECIPE}+{v}" for v in RECIPE_VARIANTS] \
    + [f"{DETECTRON2}+{v}" for v in DETECTRON2_VARIANTS]


def default_contenders(names: List[str], regime: str) -> List[str]:
    """The contenders of ``--contenders all`` in `regime` among `names`."""
    return [n for n in names if regime != "shapes" or n not in ADDED_WITH_THIN]


def contender_names() -> List[str]:
    """The main contenders first, then the one-at-a-time variants."""
    variants = [f"fcos-d2 {v}" for v in VARIANTS if v != "official"] + list(EVAL_VARIANTS) \
        + [f"{RECIPE}+{v}" for v in RECIPE_VARIANTS] \
        + [f"{DETECTRON2}+{v}" for v in DETECTRON2_VARIANTS]
    return ["fcos-d2 official", RECIPE, DETECTRON2, "torchvision", LABELENC,
            SAME_ITERATIONS, *STEP2_VARIANTS, LABELENC_LEF_ONLY] + variants


# ---------------------------------------------------------------- one run (child process)

def contender_overrides(name: str) -> List[str]:
    """The config overrides that make contender `name` from the recipe config: none for the
    recipe, their own centre radius for the other projects' FCOS (RADIUS_15, then a
    detectron2 variant's), OFFICIAL plus the variant's for fcos-d2 variants, the variant's
    alone for recipe variants, and for an inference-only variant its base's plus its own."""
    if name in EVAL_VARIANTS:
        base, overrides = EVAL_VARIANTS[name]
        return contender_overrides(base) + overrides
    if name.startswith("fcos-d2 ") and name[len("fcos-d2 "):] in VARIANTS:
        return OFFICIAL + VARIANTS[name[len("fcos-d2 "):]]
    base, _, variant = name.partition("+")  # "BASE+VARIANT": the variant's overrides alone
    own = RADIUS_15 if base in (DETECTRON2, "torchvision") else []  # their own radius
    return own + list({RECIPE: RECIPE_VARIANTS, DETECTRON2: DETECTRON2_VARIANTS}.get(base, {})
                      .get(variant, []))


def _setup_cfg(name: str, seed: int, output_dir: str, opts: List[str], labelenc_step: int = 0,
               regime: str = "shapes"):
    """The config of contender `name` (for LABELENC: of its step `labelenc_step`) in
    `regime`: the recipe config, the regime's data, the protocol's schedule, then the
    contender's overrides (so that a variant may change the schedule too), then `opts`."""
    from detectron2.config import get_cfg

    from fcos_d2 import add_fcos_config
    from fcos_d2.modeling.labelenc import extend_step1_schedule

    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(CONFIG))
    (train_name, *_), (val_name, *_) = REGIMES[regime].datasets
    cfg.merge_from_list(list(REGIMES[regime].overrides))
    cfg.merge_from_list(["DATASETS.TRAIN", (train_name,), "DATASETS.TEST", (val_name,),
                         "DATALOADER.NUM_WORKERS", 0, "MODEL.DEVICE", "cpu", "SEED", seed,
                         "OUTPUT_DIR", output_dir, *REGIME, *SCHEDULES.get(name, [])])
    cfg.merge_from_list(contender_overrides(name))
    cfg.merge_from_list(LABELENC_STEPS.get(labelenc_step, []))
    cfg.merge_from_list(opts)
    extend_step1_schedule(cfg)  # as train_net.py: step 1 adds the warm-up to the schedule
    cfg.freeze()
    return cfg


def _register_datasets(regime: str = "shapes") -> None:
    from fcos_d2.data import register_coco_dataset
    from fcos_d2.data.synthetic import ANNOTATIONS_FILE, IMAGES_FOLDER

    for name, split, count in REGIMES[regime].datasets:
        folder = _ensure_split(regime, split, count)
        register_coco_dataset(name, str(folder / ANNOTATIONS_FILE), str(folder / IMAGES_FOLDER))


def _ensure_split(regime: str, split: str, count: int) -> Path:
    """The folder of the first `count` images of `split` of the regime's synthetic set,
    generated unless cached."""
    from fcos_d2.data.synthetic import ensure_synthetic_shapes
    from fcos_d2.data.synthetic_thin import ensure_synthetic_thin

    ensure = {"shapes": ensure_synthetic_shapes, "thin": ensure_synthetic_thin}
    return ensure[REGIMES[regime].generator](split, num_images=count)


def build_contender(name: str, cfg):
    """The detector of contender `name` on fcos-d2's backbone for `cfg`."""
    from detectron2.modeling import build_backbone

    from fcos_d2.modeling.labelenc import build_labelenc_model

    if name.startswith("fcos-d2"):
        return build_labelenc_model(cfg)  # detectron2's build_model unless a LabelEnc step
    from train_quality_adapters import build_detectron2_fcos, build_torchvision_fcos

    base = name.split("+")[0]  # "detectron2+NAME": detectron2's FCOS, NAME's schedule
    builder = {"torchvision": build_torchvision_fcos, DETECTRON2: build_detectron2_fcos}[base]
    # on MODEL.DEVICE, as detectron2's build_model puts fcos-d2 (`MODEL.DEVICE cuda` at the
    # end of the command line trains every contender on the GPU)
    return builder(cfg, build_backbone(cfg)).to(cfg.MODEL.DEVICE)


def run_one(name: str, seed: int, output_dir: str, opts: List[str], regime: str = "shapes",
            diagnostics: bool = False, init_seed: Optional[int] = None,
            step1_from: Optional[str] = None) -> List[dict]:
    """Trains contender `name` with `seed` in `regime`; returns its COCO box metrics and
    losses (and with `diagnostics` the run's ``train_quality_diagnostics`` record), then
    those of each inference-only variant based on it (``EVAL_VARIANTS``). Records of a
    regime other than "shapes" carry its name ("regime"). With `init_seed`, the weights are
    initialised from it instead of `seed` (``train``), and the records carry it. A step-2
    variant starts from the LABELENC run in `step1_from` (default: beside it). Every record
    carries the overrides it ran with ("opts")."""
    tag = {"opts": [str(o) for o in opts], **({} if regime == "shapes" else {"regime": regime})}
    if init_seed is not None:
        tag["init_seed"] = init_seed
    return [{**record, **tag} for record in _run_one(name, seed, output_dir, opts, regime,
                                                      diagnostics, init_seed, step1_from)]


def _run_one(name: str, seed: int, output_dir: str, opts: List[str], regime: str,
             diagnostics: bool, init_seed: Optional[int],
             step1_from: Optional[str] = None) -> List[dict]:
    import torch

    torch.set_num_threads(1)
    _register_datasets(regime)
    if init_seed is not None and (name in STEP1_VARIANTS or name in STEP2_VARIANTS):
        raise ValueError(f"--init-seed is for one-step contenders; {name!r} trains in steps")
    if name in STEP1_VARIANTS:
        return [run_labelenc(name, seed, output_dir, opts, regime)]
    if name in STEP2_VARIANTS:
        return [run_step2_variant(name, seed, output_dir, opts, regime, step1_from)]
    cfg = _setup_cfg(name, seed, output_dir, opts, regime=regime)
    model, common = train(name, cfg, seed, diagnostics=diagnostics, init_seed=init_seed)
    if common["status"] != "ok":
        return [{"contender": name, "AP": 0.0, "AP50": 0.0, **common}]
    os.makedirs(output_dir, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(output_dir, "model_final.pth"))
    results = [{"contender": name, **evaluate(model, cfg), **common}]
    for variant, (base, _) in EVAL_VARIANTS.items():
        if base == name:
            variant_cfg = _setup_cfg(variant, seed, output_dir, opts, regime=regime)
            variant_model = build_contender(variant, variant_cfg)
            variant_model.load_state_dict(model.state_dict())
            results.append({"contender": variant, **evaluate(variant_model, variant_cfg), **common})
    return results


def train(name: str, cfg, seed: int, init=None, diagnostics: bool = False,
          init_seed: Optional[int] = None):
    """Builds contender `name` for `cfg` (then calls ``init(model)`` if given) and trains it
    with the protocol's loader, optimizer and schedule; returns it and a dict of the run's
    seed, status, final losses and training seconds (with `diagnostics`, also
    "diagnostics": losses, positives per level, gradient norms, BN statistics, regression
    outputs and positives' scores, from ``train_quality_diagnostics``).

    `seed` seeds every generator (detectron2's ``seed_all_rng``); `init_seed`, if given,
    then reseeds torch's alone. Torch's generator draws the initial weights and numpy's the
    image order (``TrainingSampler``'s seed) and the augmentation, so the two seeds split a
    run's randomness into initialisation and data; ``init_seed == seed`` is the plain run."""
    import torch
    from detectron2.data import build_detection_train_loader
    from detectron2.engine import SimpleTrainer, hooks
    from detectron2.solver import build_lr_scheduler
    from detectron2.utils.env import seed_all_rng

    from fcos_d2.engine.optimizer import build_optimizer  # SOLVER.OPTIMIZER: SGD or AdamW

    seed_all_rng(seed)
    if init_seed is not None:
        torch.manual_seed(init_seed)
    model = build_contender(name, cfg)
    if init is not None:
        init(model)
    optimizer = build_optimizer(cfg, model)
    scheduler = build_lr_scheduler(cfg, optimizer)
    trainer = SimpleTrainer(model, build_detection_train_loader(cfg), optimizer)
    recorder = _loss_recorder()
    trainer.register_hooks([hooks.LRScheduler(optimizer, scheduler), recorder])
    if diagnostics:
        from train_quality_diagnostics import TrainingDiagnostics

        watcher = TrainingDiagnostics(model)
        trainer.register_hooks([watcher])
    start = time.perf_counter()
    status = "ok"
    try:
        trainer.train(0, cfg.SOLVER.MAX_ITER)
    except FloatingPointError as error:  # SimpleTrainer's check of non-finite losses
        status = f"diverged: {error}"
    record = {"seed": seed, "status": status, "final_losses": recorder.tail(),
              "train_seconds": round(time.perf_counter() - start, 1)}
    if diagnostics:
        record["diagnostics"] = watcher.record()
    return model, record


def run_labelenc(name: str, seed: int, output_dir: str, opts: List[str],
                 regime: str = "shapes") -> dict:
    """LabelEnc's step 1 (with `name`'s ``STEP1_VARIANTS`` overrides), then its step 2
    from it; the AP is that of step 2's weights loaded strictly into the plain recipe FCOS.
    Also reports the AP of step 1's detector (None if it trains none), that of its LEF
    (``evaluate_lef``) and the training seconds of each step."""
    import torch

    folder = os.path.join(output_dir, "step1")
    cfg1 = step1_cfg(name, seed, folder, opts, regime)
    step1, common1 = train(name, cfg1, seed)
    if common1["status"] != "ok":
        return {"contender": name, "AP": 0.0, "AP50": 0.0, **common1,
                "train_seconds_step1": common1["train_seconds"]}
    os.makedirs(folder, exist_ok=True)
    weights = os.path.join(folder, "model_final.pth")
    torch.save({"model": step1.state_dict()}, weights)
    step1_record = {"final_losses_step1": common1["final_losses"],
                    "step1_AP": (evaluate(step1, cfg1)["AP"]
                                 if cfg1.MODEL.LABELENC.STEP1_DETECTOR else None),
                    "step1_lef_AP": evaluate_lef(step1, cfg1)["AP"],
                    "train_seconds_step1": common1["train_seconds"]}
    return run_labelenc_step2(name, seed, output_dir, opts, weights, step1_record, regime)


def step1_cfg(name: str, seed: int, output_dir: str, opts: List[str], regime: str = "shapes"):
    """The step-1 config of two-step contender `name` (``STEP1_VARIANTS``)."""
    return _setup_cfg(name, seed, output_dir, [*STEP1_VARIANTS[name], *opts], labelenc_step=1,
                      regime=regime)


def evaluate_lef(step1, cfg) -> Dict[str, float]:
    """COCO box AP of step 1's head on its LEF's features of the validation images' ground
    truth (``detect_from_labels``): how well the LEF encodes the labels."""
    from fcos_d2.modeling.labelenc import DetectFromLabels, annotated_test_mapper

    return evaluate(DetectFromLabels(step1), cfg, mapper=annotated_test_mapper(cfg))


def run_labelenc_step2(name: str, seed: int, output_dir: str, opts: List[str], weights: str,
                       step1_record: dict, regime: str = "shapes") -> dict:
    """LabelEnc's step 2 from the step-1 file `weights` (with contender `name`'s
    overrides); the AP is that of its weights loaded strictly into the plain recipe FCOS."""
    import torch

    from fcos_d2.modeling.labelenc import fcos_state_dict, init_step2_from_step1

    folder = os.path.join(output_dir, "step2")
    cfg2 = _setup_cfg(name, seed, folder, [*STEP2_VARIANTS.get(name, []), *opts,
                                           "MODEL.LABELENC.WEIGHTS", weights], labelenc_step=2,
                      regime=regime)
    step2, common2 = train(name, cfg2, seed,
                           init=lambda model: init_step2_from_step1(
                               model, weights,
                               backbone_from_step1=cfg2.MODEL.LABELENC.STEP2_BACKBONE == "step1"))
    common = {**common2, **step1_record, "train_seconds_step2": common2["train_seconds"],
              "train_seconds": round(step1_record["train_seconds_step1"]
                                     + common2["train_seconds"], 1)}
    if common2["status"] != "ok":
        return {"contender": name, "AP": 0.0, "AP50": 0.0, **common}
    plain_cfg = _setup_cfg(RECIPE, seed, folder, opts, regime=regime)
    plain = build_contender(RECIPE, plain_cfg)
    plain.load_state_dict(fcos_state_dict(step2.state_dict()))  # strict: a plain FCOS
    os.makedirs(folder, exist_ok=True)
    torch.save(plain.state_dict(), os.path.join(folder, "model_final_fcos.pth"))
    return {"contender": name, **evaluate(plain, plain_cfg), **common}


def run_step2_variant(name: str, seed: int, output_dir: str, opts: List[str],
                      regime: str = "shapes", step1_from: Optional[str] = None) -> dict:
    """Step 2 of `name` (``STEP2_VARIANTS``) from the step-1 weights of LABELENC's run with
    the same seed, which must have run first: in the same --output, or in the --output
    folder `step1_from` (an earlier benchmark's, of the same regime)."""
    root = Path(step1_from) if step1_from else Path(output_dir).parents[1]
    problem = missing_step1(root, seed, regime, opts)
    if problem:
        where = f"--step1-from {root}" if step1_from else "--output"
        raise FileNotFoundError(f"{name} seed {seed}: {problem}; run the contender "
                                f"'{LABELENC}' with this seed (and {where}) first")
    record = labelenc_record(root, seed, regime)
    step1_record = {k: record[k] for k in ("final_losses_step1", "step1_AP", "step1_lef_AP",
                                           "train_seconds_step1") if k in record}
    return run_labelenc_step2(name, seed, output_dir, opts, str(step1_weights(root, seed)),
                              step1_record, regime)


def step1_weights(root: Path, seed: int) -> Path:
    """Where a benchmark with --output `root` keeps the step-1 weights of LABELENC's run."""
    return root / "runs" / f"{LABELENC}-{seed}" / "step1" / "model_final.pth"


def missing_step1(root: Path, seed: int, regime: str,
                  opts: Optional[List[str]] = None) -> Optional[str]:
    """What the --output folder `root` lacks to start a step-2 variant of `seed` from its
    LABELENC run (its step-1 weights, its record in results.jsonl of `regime`, trained with
    the overrides `opts` if given); None if nothing."""
    weights = step1_weights(root, seed)
    if not weights.is_file():
        return f"no step-1 weights {weights}"
    record = labelenc_record(root, seed, regime)
    if record is None:
        return f"no record of '{LABELENC}' seed {seed} in {root / 'results.jsonl'}"
    return None if opts is None else other_overrides([record], opts)


def model_overrides(opts: List[str]) -> List[str]:
    """`opts` (KEY VALUE ...) as strings, without MODEL.DEVICE: the overrides that change
    what a run trains (the device changes only where it trains)."""
    opts = [str(o) for o in opts]
    pairs = [opts[i:i + 2] for i in range(0, len(opts), 2)]
    return [item for pair in pairs if pair[0] != "MODEL.DEVICE" for item in pair]


def other_overrides(records: List[dict], opts: List[str]) -> Optional[str]:
    """The first of `records` trained with other overrides than `opts` (MODEL.DEVICE aside),
    described; None if none. A record without "opts" (written before records kept them)
    cannot be checked and passes."""
    wanted = model_overrides(opts)
    for record in records:
        if "opts" in record and model_overrides(record["opts"]) != wanted:
            return (f"'{record['contender']}' seed {record['seed']} ran with the overrides "
                    f"{record['opts'] or 'none'}, not {list(opts) or 'none'}")
    return None


def labelenc_record(root: Path, seed: int, regime: str) -> Optional[dict]:
    """The record of LABELENC's run of `seed` in `root`/results.jsonl (of `regime`), if any."""
    return next((r for r in checked_results(root / "results.jsonl", regime)
                 if r["contender"] == LABELENC and r["seed"] == seed), None)


def evaluate(model, cfg, mapper=None) -> Dict[str, float]:
    """COCO box AP, AP50 and APs of `model` on the validation images (``DATASETS.TEST``),
    read with `mapper` (None: detectron2's test mapper)."""
    import torch
    from detectron2.data import build_detection_test_loader
    from detectron2.evaluation import COCOEvaluator, inference_on_dataset

    model.eval()
    val_name = cfg.DATASETS.TEST[0]
    evaluator = COCOEvaluator(val_name, tasks=("bbox",), use_fast_impl=False)
    with torch.no_grad():
        metrics = inference_on_dataset(model, build_detection_test_loader(cfg, val_name,
                                                                         mapper=mapper),
                                       evaluator)["bbox"]
    return {"AP": metrics["AP"], "AP50": metrics["AP50"], "APs": metrics.get("APs")}


NOT_LOSSES = {"data_time", "rank_data_time", "lr", "time", "eta_seconds", "num_pos_anchors"}


def _loss_recorder():
    """A hook that keeps each loss's values, to report their median over the last 100."""
    from detectron2.engine import HookBase

    class LossRecorder(HookBase):
        def __init__(self):
            self.values: Dict[str, List[float]] = {}

        def after_step(self):
            for key, (value, _) in self.trainer.storage.latest().items():
                if key not in NOT_LOSSES:
                    self.values.setdefault(key, []).append(float(value))

        def tail(self) -> Dict[str, float]:
            return {k: round(statistics.median(v[-100:]), 4) for k, v in self.values.items()}

    return LossRecorder()


# ---------------------------------------------------------------- driver

def has_detectron2_fcos() -> bool:
    """Whether the installed detectron2 has the built-in FCOS (v0.6 and main have)."""
    import importlib.util

    import fcos_d2  # noqa: F401  (before detectron2)

    return importlib.util.find_spec("detectron2.modeling.meta_arch.fcos") is not None


def load_results(path: Path) -> List[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarise(results: List[dict], names: List[str]) -> str:
    """A markdown table: per contender, mean / sample std / range of AP and AP50."""
    rows = ["| contender | seeds | AP mean | AP std | AP min-max | AP50 mean | AP50 std |",
            "|---|---|---|---|---|---|---|"]
    for name in names:
        runs = sorted((r for r in results if r["contender"] == name), key=lambda r: r["seed"])
        if not runs:
            continue
        ap, ap50 = [r["AP"] for r in runs], [r["AP50"] for r in runs]
        std = lambda v: statistics.stdev(v) if len(v) > 1 else float("nan")  # noqa: E731
        notes = "; ".join(f"seed {r['seed']} {r['status']}" for r in runs if r["status"] != "ok")
        rows.append(f"| {name}{' (' + notes + ')' if notes else ''} | "
                    f"{','.join(str(r['seed']) for r in runs)} | {statistics.mean(ap):.1f} | "
                    f"{std(ap):.1f} | {min(ap):.1f}-{max(ap):.1f} | {statistics.mean(ap50):.1f} | "
                    f"{std(ap50):.1f} |")
    return "\n".join(rows)


def summarise_times(results: List[dict], names: List[str]) -> str:
    """A markdown table: per contender, the mean training seconds of a run (LabelEnc: of
    each step too), and for LabelEnc the mean AP of step 1's detector and of its LEF (over
    the runs that recorded them)."""
    rows = ["| contender | training s (mean) | per step | step-1 detector AP | step-1 LEF AP |",
            "|---|---|---|---|---|"]
    for name in names:
        runs = [r for r in results if r["contender"] == name and r["status"] == "ok"]
        if not runs:
            continue
        mean = lambda key: statistics.mean(r[key] for r in runs)  # noqa: E731
        steps = (f"{mean('train_seconds_step1'):.0f} + {mean('train_seconds_step2'):.0f}"
                 if "train_seconds_step2" in runs[0] else "")
        rows.append(f"| {name} | {mean('train_seconds'):.0f} | {steps} | "
                    f"{_mean_of_recorded(runs, 'step1_AP')} | "
                    f"{_mean_of_recorded(runs, 'step1_lef_AP')} |")
    return "\n".join(rows)


def _mean_of_recorded(runs: List[dict], key: str) -> str:
    """The mean of `key` over the `runs` that hold a value for it, with their count if not
    all do; blank if none does."""
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return ""
    count = "" if len(values) == len(runs) else f" ({len(values)} of {len(runs)} runs)"
    return f"{statistics.mean(values):.1f}{count}"


def labelenc_iteration_cost(repeats: int) -> str:
    """A markdown table: the median seconds of one training iteration (forward, backward,
    SGD step; the first batch of the protocol's loader; one thread) of the recipe and of
    LabelEnc's steps with their extra losses on (step 1 also LEF-only), timed in turn in one
    process so that other load hits them alike; and each as a multiple of the recipe's."""
    import torch
    from detectron2.data import build_detection_train_loader
    from detectron2.utils.events import EventStorage

    from fcos_d2.engine.optimizer import build_optimizer

    torch.set_num_threads(1)
    _register_datasets()
    configs = {RECIPE: _setup_cfg(RECIPE, 0, "unused", []),
               "LabelEnc step 1": _setup_cfg(LABELENC, 0, "unused", [], labelenc_step=1),
               "LabelEnc step 1, LEF only": step1_cfg(LABELENC_LEF_ONLY, 0, "unused", []),
               "LabelEnc step 2": _setup_cfg(LABELENC, 0, "unused", [], labelenc_step=2)}
    models = {k: build_contender(RECIPE if k == RECIPE else LABELENC, cfg).train()
              for k, cfg in configs.items()}
    optimizers = {k: build_optimizer(configs[k], model) for k, model in models.items()}
    batch = next(iter(build_detection_train_loader(configs[RECIPE])))
    seconds = {k: [] for k in models}
    # at this iteration step 1's distance loss and step 2's auxiliary loss are both on
    with EventStorage(LABELENC_WARMUP):
        for round_ in range(repeats + 1):  # round 0 warms up
            for name, model in models.items():
                start = time.perf_counter()
                losses = model(batch)
                optimizers[name].zero_grad()
                sum(losses.values()).backward()
                optimizers[name].step()
                if round_:
                    seconds[name].append(time.perf_counter() - start)
    recipe = statistics.median(seconds[RECIPE])
    rows = ["| training iteration | median s | x recipe |", "|---|---|---|"]
    rows += [f"| {name} | {statistics.median(s):.3f} | {statistics.median(s) / recipe:.2f} |"
             for name, s in seconds.items()]
    return "\n".join(rows)


def regime_iteration_cost(repeats: int) -> str:
    """A markdown table: the median seconds of one training iteration (forward, backward,
    SGD step; one thread) of the recipe in each regime, on the first `repeats` batches of
    the regime's loader, regimes timed in turn in one process so that other load hits all
    alike (after one warm-up iteration each); and each as a multiple of "shapes"'s."""
    import itertools

    import torch
    from detectron2.data import build_detection_train_loader
    from detectron2.utils.events import EventStorage

    from fcos_d2.engine.optimizer import build_optimizer

    torch.set_num_threads(1)
    configs, models, optimizers, batches = {}, {}, {}, {}
    for regime in REGIMES:
        _register_datasets(regime)
        configs[regime] = _setup_cfg(RECIPE, 0, "unused", [], regime=regime)
        models[regime] = build_contender(RECIPE, configs[regime]).train()
        optimizers[regime] = build_optimizer(configs[regime], models[regime])
        loader = build_detection_train_loader(configs[regime])
        batches[regime] = list(itertools.islice(iter(loader), repeats + 1))
    seconds = {regime: [] for regime in REGIMES}
    with EventStorage(0):
        for round_ in range(repeats + 1):  # round 0 warms up
            for regime, model in models.items():
                start = time.perf_counter()
                losses = model(batches[regime][round_])
                optimizers[regime].zero_grad()
                sum(losses.values()).backward()
                optimizers[regime].step()
                if round_:
                    seconds[regime].append(time.perf_counter() - start)
    base = statistics.median(seconds["shapes"])
    rows = ["| regime | median s per iteration | x shapes | est. min per run (600 it.) |",
            "|---|---|---|---|"]
    rows += [f"| {regime} | {statistics.median(s):.3f} | {statistics.median(s) / base:.2f} | "
             f"{statistics.median(s) * REGIME[1] / 60:.0f} |" for regime, s in seconds.items()]
    return "\n".join(rows)


POSITIVES_CONTENDERS = ["fcos-d2 official", RECIPE, f"{RECIPE}+center-sampling-1.5", "fcos-d2 atss",
                        f"{RECIPE}+atss-anchors-4"]


def positives_table(regime: str, contenders: List[str]) -> str:
    """Where the assignment of each fcos-d2 contender puts the positives of the regime's
    training images (``train_quality_diagnostics.positives_per_level``; no training)."""
    import torch
    from detectron2.data import DatasetCatalog
    from detectron2.structures import Boxes, Instances

    from train_quality_diagnostics import positives_per_level

    def assigner(model):
        def matched(locations, boxes):
            instances = Instances((1, 1), gt_boxes=Boxes(boxes),
                                  gt_classes=torch.zeros(len(boxes), dtype=torch.int64))
            return model.targets(locations, [instances])[2][0]  # (R,)
        return matched

    _register_datasets(regime)
    assigners = {name: assigner(build_contender(name, _setup_cfg(name, 0, "unused", [],
                                                                   regime=regime)))
                 for name in contenders}
    return positives_per_level(DatasetCatalog.get(REGIMES[regime].datasets[0][0]), assigners)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regime", choices=sorted(REGIMES), default="shapes",
                        help="shapes: 128-px shapes, 6 classes (default); thin: 256-352 px "
                             "images, 10 classes of thin and filled objects")
    parser.add_argument("--contenders", nargs="+", default=["all"],
                        help="names as --list prints them, or 'all'")
    parser.add_argument("--seeds", nargs="+", type=int,
                        help="default: the regime's (shapes 0 1 2, thin 0 1 2 3 4)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    parser.add_argument("--output", help="default output/train_quality (shapes), "
                                         "output/train_quality_thin (thin)")
    parser.add_argument("--diagnostics", action="store_true",
                        help="record per run losses over training, positives per level, "
                             "gradient norms, BN statistics, regression outputs and the "
                             "positives' scores (train_quality_diagnostics.py)")
    parser.add_argument("--list", action="store_true", help="print the contenders and exit")
    parser.add_argument("--labelenc-cost", type=int, metavar="REPEATS",
                        help="time training iterations of the recipe and LabelEnc's steps "
                             "side by side (REPEATS rounds), print the table and exit")
    parser.add_argument("--positives", action="store_true",
                        help="count where the assignment of fcos-d2 contenders (--contenders, "
                             "default: official, recipe, atss, recipe+atss-anchors-4) puts "
                             "the positives of the regime's training images, print, exit")
    parser.add_argument("--regime-cost", type=int, metavar="REPEATS",
                        help="time training iterations of the recipe in every regime side "
                             "by side (REPEATS rounds), print the table and exit")
    parser.add_argument("--reevaluate", type=int, metavar="N",
                        help="score every stored run's weights (of --contenders) on the N "
                             "validation images after the regime's first ones, write "
                             "OUTPUT/reevaluated.jsonl, print the table of both and exit "
                             "(train_quality_reevaluate.py)")
    parser.add_argument("--weight-growth", action="store_true",
                        help="print how far training grew the backbone's conv weight norms "
                             "in every stored run (of --contenders), beside its AP and stem "
                             "BN statistics, and exit (train_quality_diagnostics.py)")
    parser.add_argument("--init-seed", type=int, metavar="N",
                        help="initialise the weights from seed N in every run, while each "
                             "run's seed still draws the image order and augmentation: "
                             "tells initialisation from data as a source of variance "
                             "(default output: the regime's folder / init_seed_N)")
    parser.add_argument("--step1-from", metavar="DIR",
                        help="LabelEnc's step-2 variants start from the step 1 of the "
                             f"'{LABELENC}' runs in DIR (an earlier --output of the same "
                             "regime) instead of training it in this --output")
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[],
                        help="config overrides for every contender (KEY VALUE ...); runs "
                             "with other overrides (MODEL.DEVICE aside) need another "
                             "--output: the command refuses to mix them")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # child: one contender ...
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)  # ... and one seed
    return parser


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    output = Path(args.output or REPO / "output" / REGIMES[args.regime].output)
    if args.init_seed is not None and not args.output:
        output = output / f"init_seed_{args.init_seed}"
    if args.run:
        import fcos_d2  # noqa: F401  (before detectron2)

        results = run_one(args.run, args.seed, str(output / "runs" / f"{args.run}-{args.seed}"),
                          args.opts, regime=args.regime, diagnostics=args.diagnostics,
                          init_seed=args.init_seed, step1_from=args.step1_from)
        with open(output / "results.jsonl", "a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in results))
        return
    names = contender_names()
    if not has_detectron2_fcos():
        print("the installed detectron2 has no detectron2.modeling.meta_arch.fcos: the "
              "'detectron2' contender is left out")
        names = [n for n in names if n.split("+")[0] != DETECTRON2]
    if args.labelenc_cost or args.regime_cost:
        import fcos_d2  # noqa: F401  (before detectron2)

        print(labelenc_iteration_cost(args.labelenc_cost) if args.labelenc_cost
              else regime_iteration_cost(args.regime_cost))
        return
    if args.list:
        print("\n".join(names))
        return
    if args.positives:
        import fcos_d2  # noqa: F401  (before detectron2)

        print(positives_table(args.regime, POSITIVES_CONTENDERS if args.contenders == ["all"]
                              else args.contenders))
        return
    if args.reevaluate:
        print(reevaluate_runs(args.regime, output, args.reevaluate,
                              None if args.contenders == ["all"] else args.contenders))
        return
    if args.weight_growth:
        print(weight_growth_runs(output, None if args.contenders == ["all"]
                                 else args.contenders))
        return
    chosen = default_contenders(names, args.regime) if args.contenders == ["all"] \
        else args.contenders
    unknown = [c for c in chosen if c not in names]
    if unknown:
        parser.error(f"unknown contenders {unknown}; --list prints the names")
    if args.step1_from and any(c in STEP2_VARIANTS for c in chosen):
        missing = [missing_step1(Path(args.step1_from), seed, args.regime, args.opts)
                   for seed in args.seeds or REGIMES[args.regime].seeds]
        if any(missing):
            parser.error(f"--step1-from {args.step1_from}: {'; '.join(filter(None, missing))}")
    run_benchmark(chosen, names, args, output)


def run_benchmark(chosen: List[str], names: List[str], args, output: Path) -> None:
    """Runs the (contender, seed) pairs of `chosen` x the seeds not yet in
    ``output/results.jsonl``, then writes and prints the table of every contender there."""
    output.mkdir(parents=True, exist_ok=True)
    results = checked_results(output / "results.jsonl", args.regime)
    clash = other_overrides(results, args.opts)
    if clash:  # its runs would count as done, and one table would mix two settings
        raise SystemExit(f"{output / 'results.jsonl'}: {clash}; use another --output for "
                         "these overrides")
    _prepare_datasets(args.regime)
    done = {(r["contender"], r["seed"]) for r in results}
    # an inference-only variant comes with its base contender's run
    to_train = list(OrderedDict.fromkeys(EVAL_VARIANTS[c][0] if c in EVAL_VARIANTS else c
                                         for c in chosen))
    seeds = args.seeds or REGIMES[args.regime].seeds
    todo = [(c, s) for s in seeds for c in to_train if (c, s) not in done]
    extra = [*(["--regime", args.regime] if args.regime != "shapes" else []),
             *(["--diagnostics"] if args.diagnostics else []),
             *(["--init-seed", str(args.init_seed)] if args.init_seed is not None else []),
             *(["--step1-from", str(args.step1_from)] if args.step1_from else [])]
    _run_all(todo, args.jobs, output, args.opts, extra_args=extra,
             step2_waits=not args.step1_from)
    # every contender with runs in the file, also those of earlier invocations
    results = checked_results(output / "results.jsonl", args.regime)
    table = summarise(results, names) + "\n\n" + summarise_times(results, names)
    (output / "table.md").write_text(table + "\n")
    print(table)
    if any(r.get("diagnostics") for r in results):
        from train_quality_diagnostics import summarise_diagnostics

        diagnostics = summarise_diagnostics(results, names)
        (output / "diagnostics.md").write_text(diagnostics + "\n")
        print("\n" + diagnostics)


def checked_results(path: Path, regime: str) -> List[dict]:
    """The records of `path`, which must all be of `regime` (a record without "regime" is
    of "shapes"): results of two regimes never mix in one table."""
    results = load_results(path)
    others = sorted({r.get("regime", "shapes") for r in results} - {regime})
    if others:
        raise SystemExit(f"{path} holds results of regime {others}, not of '{regime}': use "
                         f"another --output for --regime {regime}")
    return results


def reevaluate_runs(regime: str, output: Path, count: int,
                    contenders: Optional[List[str]] = None) -> str:
    """Scores the runs stored under `output` on the `count` validation images of `regime`
    after its first ones (``train_quality_reevaluate``); returns the table of both scores."""
    import fcos_d2  # noqa: F401  (before detectron2)
    import torch
    from fcos_d2.data import register_coco_dataset
    from fcos_d2.data.synthetic import ANNOTATIONS_FILE, IMAGES_FOLDER

    from train_quality_reevaluate import (EXTRA_VAL_NAME, further_images, reevaluate,
                                          reevaluation_table, stored_runs)

    torch.set_num_threads(1)
    _register_datasets(regime)
    (_, val_split, val_count) = REGIMES[regime].datasets[1]
    folder = _ensure_split(regime, val_split, val_count + count)
    name = EXTRA_VAL_NAME.format(regime=regime, count=count)
    coco = json.loads((folder / ANNOTATIONS_FILE).read_text())
    annotations = output / f"{name}.json"
    annotations.write_text(json.dumps(further_images(coco, val_count)))
    register_coco_dataset(name, str(annotations), str(folder / IMAGES_FOLDER))

    def build(contender: str, seed: int, dataset: str):
        cfg = _setup_cfg(contender, seed, str(output / "runs" / f"{contender}-{seed}"),
                         ["DATASETS.TEST", (dataset,)], regime=regime)
        return build_contender(contender, cfg), cfg

    further = reevaluate(stored_runs(output / "runs", contenders), build=build,
                         evaluate=evaluate, dataset_name=name,
                         results_file=output / "reevaluated.jsonl")
    return reevaluation_table(checked_results(output / "results.jsonl", regime), further,
                              count, val_count)


def weight_growth_runs(output: Path, contenders: Optional[List[str]] = None) -> str:
    """The weight growth per backbone stage of the runs stored under `output`
    (``train_quality_diagnostics.weight_growth_table``)."""
    from train_quality_diagnostics import weight_growth_table
    from train_quality_reevaluate import stored_runs

    results = [json.loads(line) for line in open(output / "results.jsonl")]
    return weight_growth_table(stored_runs(output / "runs", contenders), results)


def _prepare_datasets(regime: str = "shapes") -> None:
    import fcos_d2  # noqa: F401

    for _, split, count in REGIMES[regime].datasets:  # once here: runs never race to make them
        _ensure_split(regime, split, count)


def _next_ready(todo, running, step2_waits: bool = True):
    """The index of the first (contender, seed) of `todo` that can start: a step-2 variant
    waits for LabelEnc's run of its seed, whose step 1 it starts from (unless not
    `step2_waits`: its step 1 comes from elsewhere); None if none can."""
    waiting = {(name, seed) for name, seed in todo} | {(r[0], r[1]) for r in running}
    for index, (name, seed) in enumerate(todo):
        if name not in STEP2_VARIANTS or not step2_waits or (LABELENC, seed) not in waiting:
            return index
    return None


def _run_all(todo, jobs: int, output: Path, opts: List[str], script: str = __file__,
             extra_args: List[str] = (), step2_waits: bool = True) -> None:
    """Runs each (contender, seed) in a child process, `jobs` at a time: ``script --run NAME
    --seed SEED --output OUTPUT EXTRA_ARGS OPTS`` (tools/mask_quality.py reuses it with its
    own script). Step-2 variants wait for LabelEnc's run of their seed if `step2_waits`."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO / "tools"), os.environ.get("PYTHONPATH", "")]))
    running = []
    while todo or running:
        while len(running) < jobs and _next_ready(todo, running, step2_waits) is not None:
            name, seed = todo.pop(_next_ready(todo, running, step2_waits))
            log = open(output / f"log-{name.replace(' ', '_')}-{seed}.txt", "w")
            cmd = [sys.executable, script, "--run", name, "--seed", str(seed), "--output",
                   str(output), *extra_args, *opts]
            running.append((name, seed, subprocess.Popen(cmd, env=env, stdout=log,
                                                         stderr=subprocess.STDOUT), time.time()))
            print(f"started {name} seed {seed}", flush=True)
        for item in list(running):
            name, seed, process, started = item
            if process.poll() is not None:
                running.remove(item)
                print(f"finished {name} seed {seed}: exit {process.returncode}, "
                      f"{time.time() - started:.0f} s", flush=True)
        time.sleep(1)


if __name__ == "__main__":
    main()
