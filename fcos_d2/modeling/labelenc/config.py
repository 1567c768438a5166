"""``add_labelenc_config``: the ``MODEL.LABELENC`` node, and the step-1 schedule.

LabelEnc (Hao et al., 2020) trains FCOS in two steps: step 1 learns a label-encoding
function (LEF) next to an auxiliary detector, step 2 trains the final detector with the
LEF's features as an intermediate target. See ``fcos_d2/modeling/labelenc/__init__.py``.
"""
from detectron2.config import CfgNode as CN

from ...config import register_config_node

STEPS = (0, 1, 2)
# MODEL.META_ARCHITECTURE of each step (fcos_d2/modeling/labelenc/meta_arch.py)
META_ARCHITECTURES = {1: "LabelEncStep1", 2: "LabelEncStep2"}
STEP2_BACKBONES = ("weights", "step1")


@register_config_node  # add_fcos_config adds it
def add_labelenc_config(cfg: CN) -> None:
    """Adds ``MODEL.LABELENC`` to ``cfg`` in place. Safe to call twice."""
    if "LABELENC" in cfg.MODEL:
        return
    cfg.MODEL.LABELENC = _C = CN()
    # 0: plain FCOS training. 1: step 1, the detector and the label-encoding function (LEF)
    # train together (the head also runs on the LEF's features; a distance loss ties the
    # detector's features to the LEF's). 2: step 2, a new detector whose head and FPN start
    # from step 1's, with the frozen LEF's features as an auxiliary target. The weights
    # step 2 ends with are a plain FCOS (OUTPUT_DIR/model_final_fcos.pth). Steps 1 and 2
    # need MODEL.META_ARCHITECTURE "LabelEncStep1" and "LabelEncStep2" (a mismatch is an
    # error).
    _C.STEP = 0
    # Step 2: the step-1 weights (step 1's model_final.pth, or an official
    # label_encoding_function.pth, converted on the fly); the LEF, its FPN and the head
    # are read from it.
    _C.WEIGHTS = ""
    # The LEF's width: the bottleneck channels of its first stage (res2); each stage
    # doubles them and outputs 4x, so res3-res5 give 8x, 16x, 32x this. The official 64
    # (res3-res5: 512, 1024, 2048) matches ResNet-50/101; step 2 copies the LEF's FPN into
    # the detector's, so res3-res5 must match the detector's (ResNet-18/34: 16).
    _C.LEF_WIDTH = 64
    # Bottleneck blocks in the LEF's stages res2-res5 (official: 1, 2, 2, 1).
    _C.LEF_DEPTH = [1, 2, 2, 1]
    # Step 1: weight of the FCOS losses of the head on the LEF's features.
    _C.LEF_LOSS_WEIGHT = 1.0
    # Step 1: weight of the distance loss (MSE between the layer-normalized LEF features,
    # detached, and the layer-normalized detector features after the adapter).
    _C.DISTANCE_LOSS_WEIGHT = 1.0
    # Step 1: iterations without the distance loss while the LEF learns; the trainer's
    # setup (LabelEnc's trainer extension) adds them to SOLVER.MAX_ITER and SOLVER.STEPS,
    # as the official step 1 does. Official: 30000 (with the 90k COCO schedule).
    _C.DISTANCE_LOSS_WARMUP_ITERS = 30000
    # Step 1: train the detector beside the LEF (official). False: step 1 trains the LEF
    # and the head alone on label maps (no detector, no distance loss, so
    # DISTANCE_LOSS_WARMUP_ITERS must be 0), an iteration costing a fraction of the
    # detector's; step 2 is unchanged (from scratch, the LEF then detects far better: see
    # configs/LabelEnc/README.md).
    _C.STEP1_DETECTOR = True
    # Step 2: weight of the auxiliary loss (same form as the distance loss).
    _C.AUXILIARY_LOSS_WEIGHT = 1.0
    # Step 2: the auxiliary loss applies during the first this many iterations, then the
    # detector trains alone. Official: 80000 of 90000.
    _C.AUXILIARY_LOSS_ITERS = 80000
    # Step 2: where the detector's bottom-up backbone starts. "weights": from MODEL.WEIGHTS
    # (the official step 2: ImageNet weights, or random when training from scratch).
    # "step1": from step 1's detector (MODEL.LABELENC.WEIGHTS must be fcos-d2's step-1
    # checkpoint; the official file has no detector). The FPN and the head come from step 1
    # either way.
    _C.STEP2_BACKBONE = "weights"


def check_labelenc_config(cfg: CN) -> None:
    """Raises ValueError naming the first ``MODEL.LABELENC`` key with a bad value."""
    node = cfg.MODEL.LABELENC
    if node.STEP not in STEPS:
        raise ValueError(f"MODEL.LABELENC.STEP: unknown {node.STEP!r}, expected one of {STEPS}")
    _check_meta_architecture(node.STEP, cfg.MODEL.META_ARCHITECTURE)
    if node.STEP2_BACKBONE not in STEP2_BACKBONES:
        raise ValueError(f"MODEL.LABELENC.STEP2_BACKBONE: unknown {node.STEP2_BACKBONE!r}, "
                         f"expected one of {STEP2_BACKBONES}")
    if node.LEF_WIDTH < 1:
        raise ValueError(f"MODEL.LABELENC.LEF_WIDTH: must be >= 1, got {node.LEF_WIDTH}")
    if len(node.LEF_DEPTH) != 4 or min(node.LEF_DEPTH) < 1:
        raise ValueError(f"MODEL.LABELENC.LEF_DEPTH: 4 block counts >= 1 (res2-res5) "
                         f"expected, got {list(node.LEF_DEPTH)}")
    if node.STEP == 1 and not node.STEP1_DETECTOR and node.DISTANCE_LOSS_WARMUP_ITERS:
        raise ValueError("MODEL.LABELENC.DISTANCE_LOSS_WARMUP_ITERS: must be 0 with "
                         "STEP1_DETECTOR False (step 1 trains no detector, so no distance "
                         f"loss waits), got {node.DISTANCE_LOSS_WARMUP_ITERS}")
    for key in ("LEF_LOSS_WEIGHT", "DISTANCE_LOSS_WEIGHT", "AUXILIARY_LOSS_WEIGHT",
                "DISTANCE_LOSS_WARMUP_ITERS", "AUXILIARY_LOSS_ITERS"):
        if node[key] < 0:
            raise ValueError(f"MODEL.LABELENC.{key}: must be >= 0, got {node[key]}")


def _check_meta_architecture(step: int, meta_architecture: str) -> None:
    """Raises ValueError naming both keys where MODEL.LABELENC.STEP and
    MODEL.META_ARCHITECTURE disagree."""
    expected = META_ARCHITECTURES.get(step)
    if step and meta_architecture != expected:
        raise ValueError(f"MODEL.LABELENC.STEP {step} trains an FCOS with LabelEnc's step "
                         f"{step}: MODEL.META_ARCHITECTURE must be '{expected}', got "
                         f"'{meta_architecture}' (configs/LabelEnc/*.yaml set both keys)")
    steps = {name: number for number, name in META_ARCHITECTURES.items()}
    if not step and meta_architecture in steps:
        raise ValueError(f"MODEL.META_ARCHITECTURE '{meta_architecture}' is LabelEnc's step "
                         f"{steps[meta_architecture]}, but MODEL.LABELENC.STEP is 0: set "
                         f"MODEL.LABELENC.STEP {steps[meta_architecture]} (or "
                         "MODEL.META_ARCHITECTURE 'FCOS' for a plain FCOS)")


def extend_step1_schedule(cfg: CN) -> None:
    """In step 1, adds ``DISTANCE_LOSS_WARMUP_ITERS`` to ``SOLVER.MAX_ITER`` and to every
    ``SOLVER.STEPS``, as the official step-1 entry point does, so that the detector gets
    its usual schedule after the warm-up. ``cfg`` must not be frozen; nothing changes in
    the other steps."""
    if cfg.MODEL.LABELENC.STEP != 1:
        return
    warmup = cfg.MODEL.LABELENC.DISTANCE_LOSS_WARMUP_ITERS
    cfg.SOLVER.MAX_ITER += warmup
    cfg.SOLVER.STEPS = tuple(step + warmup for step in cfg.SOLVER.STEPS)
