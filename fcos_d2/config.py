"""``add_fcos_config``: the ``MODEL.FCOS`` config node.

Defaults are the improved FCOS ("imprv": center sampling, GIoU loss, normalized regression
targets, centerness on the regression branch, P6/P7 from P5), the official repo's
``FCOS_imprv`` models. Every key of ``MODEL.FCOS`` is defined here, with a comment that says
what it does; what a setting is worth is measured in ``docs/``.

``add_checkpoint_config`` (called by ``add_fcos_config``) adds the keys of MODEL.WEIGHTS'
loading: ``MODEL.WEIGHTS_ALLOW_PICKLE`` and ``MODEL.WEIGHTS_SHA256``.

Members of the family add their own nodes (``MODEL.SIPMASK``, ``MODEL.LABELENC``, ...)
through :func:`register_config_node`: the core names no member, and ``add_fcos_config``
calls every registered function, in the order they registered.
"""
from typing import Callable, List

from detectron2.config import CfgNode as CN

from .project_files import project_dir
from .evaluation.report.config import add_report_config

# configs/ of the installed package (pip install .) or of the source checkout (pip install -e).
CONFIGS_DIR = project_dir() / "configs"


def get_config_file(name: str) -> str:
    """The path of one of fcos-d2's configs, e.g. ``"FCOS-R50.yaml"`` or
    ``"lazy/fcos_R_50_FPN_1x.py"``, usable from any working directory.

    Raises:
        FileNotFoundError: naming the path.
    """
    path = CONFIGS_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"fcos-d2 config '{name}' not found: no file {path} (the "
                                f"configs are: {', '.join(_config_names())})")
    return str(path)


def _config_names():
    return sorted(str(p.relative_to(CONFIGS_DIR)) for p in CONFIGS_DIR.rglob("*")
                  if p.suffix in (".yaml", ".py"))


ConfigNodeAdder = Callable[[CN], None]
_CONFIG_NODES: List[ConfigNodeAdder] = []


def register_config_node(add: ConfigNodeAdder) -> ConfigNodeAdder:
    """Registers ``add(cfg)``, a function that adds a config node in place (safe to call
    twice), so that :func:`add_fcos_config` adds it too. Usable as a decorator; registering
    the same function again changes nothing.

    >>> @register_config_node
    ... def add_toy_config(cfg): cfg.MODEL.TOY = CN({"WIDTH": 8})
    """
    if add not in _CONFIG_NODES:
        _CONFIG_NODES.append(add)
    return add


def unregister_config_node(add: ConfigNodeAdder) -> None:
    """Removes ``add`` from the registered node adders (nothing if it is not there)."""
    if add in _CONFIG_NODES:
        _CONFIG_NODES.remove(add)


def registered_config_nodes() -> List[ConfigNodeAdder]:
    """The registered node adders, in registration order."""
    return list(_CONFIG_NODES)


def add_fcos_config(cfg: CN) -> None:
    """Adds the ``MODEL.FCOS`` node, ``add_checkpoint_config``'s keys, ``TEST.REPORT`` and
    every node registered with :func:`register_config_node` to ``cfg`` in place. Safe to
    call twice."""
    add_checkpoint_config(cfg)
    add_report_config(cfg)  # TEST.REPORT: report.html after each evaluation
    add_solver_config(cfg)  # SOLVER.OPTIMIZER: SGD or AdamW
    for add in _CONFIG_NODES:  # members' nodes (MODEL.SIPMASK, MODEL.LABELENC, ...)
        add(cfg)
    if "FCOS" in cfg.MODEL:
        return
    cfg.MODEL.FCOS = _C = CN()
    # Foreground classes only (0-based; background is NUM_CLASSES). COCO: 80.
    _C.NUM_CLASSES = 80
    # Backbone features the head runs on, fine to coarse, and their strides.
    # Their strides come from the backbone (8-128 for P3-P7).
    _C.IN_FEATURES = ["p3", "p4", "p5", "p6", "p7"]
    # Where the backbone builds P6/P7 from: "p5" (improved FCOS), "res5" (original FCOS),
    # or "" for no P6/P7 (FCOS-RT runs on P3-P5).
    _C.TOP_BLOCKS_IN = "p5"

    # Towers: NUM_CONVS 3x3 convs in each of the classification and box towers.
    _C.NUM_CONVS = 4
    # Convs shared by both branches before the towers (FCOS-RT style shared head; 0 = none).
    _C.NUM_SHARE_CONVS = 0
    # Norm in the towers: "GN" (32 groups), "BN", "SyncBN", or "" for none.
    _C.NORM = "GN"
    # Make the last conv of each tower a modulated deformable conv (DCNv2), as in the
    # official DCN models; no compiled extension (torchvision's deform_conv2d on a GPU, a
    # sampled equivalent on the CPU: fcos_d2/modeling/deform_sampling.py).
    _C.USE_DEFORMABLE = False
    # Initial bias of the classification logits = -log((1 - p) / p), for stable focal loss.
    _C.PRIOR_PROB = 0.01

    # Target assignment. Which locations are an object's positives: "fcos" (official:
    # inside the box, or its center region with CENTER_SAMPLING_RADIUS, and within the
    # level's SIZES_OF_INTEREST range) or "atss" (ATSS, Zhang et al. 2020: per level the
    # ATSS_TOPK locations nearest the box center are candidates; positive where the IoU of
    # the location's square anchor with the box reaches the mean + std of the candidates'
    # IoUs and the location lies inside the box; SIZES_OF_INTEREST and
    # CENTER_SAMPLING_RADIUS unused).
    _C.ASSIGNER = "fcos"
    # "fcos": level i takes a location whose largest regression distance lies in
    # [SIZES_OF_INTEREST[i-1], SIZES_OF_INTEREST[i]] (inclusive), with -1 and +inf at the
    # ends; one more level than boundaries. The official ranges suit 800-1333 px images;
    # for small images scale them with the objects (docs/small_data.md).
    _C.SIZES_OF_INTEREST = [64, 128, 256, 512]
    # "fcos": center sampling, positives lie within radius * stride of the box center
    # (clipped to the box). 0 disables it (original FCOS: every location inside the box).
    _C.CENTER_SAMPLING_RADIUS = 1.5
    # "atss" only: candidates per level and object (ATSS: 9).
    _C.ATSS_TOPK = 9
    # "atss" only: the side of a location's square anchor, in strides (ATSS: 8). Like
    # SIZES_OF_INTEREST it decides which level an object lands on: with 8, objects of
    # 10-100 px put nearly all their positives on P3; 4 spreads them over more levels.
    _C.ATSS_ANCHOR_SCALE = 8.0
    # Choose IN_FEATURES and SIZES_OF_INTEREST from the training boxes when training starts
    # (fcos_d2.modeling.level_choice; ResNet-FPN backbones), instead of the values above.
    # The chosen values replace them in OUTPUT_DIR/config.yaml, which then evaluates as is.
    _C.LEVELS_FROM_DATA = False
    # Training images (at most; evenly spread) read for the level-fit table logged when
    # training starts (objects by size, their level and positives); 0: no table.
    _C.LEVEL_FIT_IMAGES = 2000

    # Losses.
    # Classification loss: "focal" (official sigmoid focal loss, FOCAL_LOSS_ALPHA/GAMMA) or
    # "quality_focal" (GFL's quality focal loss, beta 2: a positive's target is the IoU of
    # its predicted box with its box, detached, instead of 1).
    _C.CLS_LOSS = "focal"
    # The focal loss' alpha (weight of the positives) and gamma (focusing exponent).
    _C.FOCAL_LOSS_ALPHA = 0.25
    _C.FOCAL_LOSS_GAMMA = 2.0
    # Box loss: "iou" (-log IoU, original), "linear_iou" (1 - IoU) or "giou" (improved).
    _C.LOC_LOSS_TYPE = "giou"
    # Regress (l, t, r, b) in units of the level's stride through a ReLU (improved), instead
    # of exp() in pixels (original).
    _C.NORM_REG_TARGETS = True
    # Predict centerness from the box tower (improved) instead of the classification tower.
    _C.CENTERNESS_ON_REG = True
    # Activation that makes the box regression positive: "relu" (improved official),
    # "exp" (original official), "softplus" (relu-like, but its gradient never vanishes),
    # or "" for the official choice for the units: "relu" when NORM_REG_TARGETS, else
    # "exp". A ReLU whose inputs all turn negative stops learning for good; softplus and
    # exp keep a gradient that pulls a too-small distance back up (docs/small_data.md).
    _C.REG_ACTIVATION = ""
    # A learnable scale per level on the box regression (official; detectron2 drops it).
    _C.USE_SCALE = True

    # Loss normalizers. "num_pos" (official): the classification and centerness losses are
    # divided by this batch's positives (mean over workers), the box loss by the sum of its
    # weights. "ema": the same quantities, smoothed by an exponential moving average (as
    # detectron2's FCOS and RetinaNet do), which steadies small batches with few objects.
    _C.LOSS_NORMALIZER = "num_pos"
    # "ema" only: the starting value (the EMA of the positives; the weight sum starts at the
    # same value times the mean weight of the first batch) and the momentum.
    _C.LOSS_NORMALIZER_EMA_INIT = 300.0
    _C.LOSS_NORMALIZER_EMA_MOMENTUM = 0.9
    # Weights of the box loss per positive: "centerness" (official: the centerness target,
    # normalized by their sum) or "none" (every positive counts once, as in detectron2).
    # With "none" and a ReLU regression, a small-data run from scratch can die
    # (docs/small_data.md).
    _C.LOC_LOSS_WEIGHTING = "centerness"
    # Smoothing s of the IoU in the box loss, (intersection + s) / (union + s), in the
    # regression's units (strides when NORM_REG_TARGETS). The official 1.0 is large next
    # to small boxes measured in strides (a 10-px box at stride 8 has area 1.6); 0 computes
    # the exact IoU, as detectron2 and torchvision do.
    _C.IOU_LOSS_SMOOTH = 1.0

    # Inference.
    # Candidates: a score above INFERENCE_TH_TEST, where the score is the class probability
    # ("probability", official, threshold 0.05) or the final score sqrt(probability *
    # centerness) ("final_score", as detectron2 and torchvision, threshold 0.2 there).
    _C.INFERENCE_TH_ON = "probability"
    _C.INFERENCE_TH_TEST = 0.05
    # Per level, keep at most this many (location, class) candidates before NMS.
    _C.PRE_NMS_TOPK_TEST = 1000
    # IoU threshold of the class-wise NMS. The final cut is TEST.DETECTIONS_PER_IMAGE.
    _C.NMS_TH_TEST = 0.6

    # FCOS as a proposal generator of a two-stage model (MODEL.PROPOSAL_GENERATOR.NAME
    # "FCOS", in place of "RPN"; configs/FCOS-RPN-R50.yaml). A location's objectness is
    # its best class score, max_k sqrt(p_k * centerness); its box is the FCOS box. No score
    # threshold: like RPN, the best PRE_NMS_TOPK per level go to a class-agnostic NMS, and
    # the best POST_NMS_TOPK per image are the proposals. Defaults: detectron2's RPN
    # settings of its FPN models (Base-RCNN-FPN.yaml). MODEL.FCOS.NUM_CLASSES must equal
    # MODEL.ROI_HEADS.NUM_CLASSES (the FCOS head learns the classes; the ROI heads refine).
    _C.PROPOSALS = CN()
    # Candidates per level before NMS, in training and in inference.
    _C.PROPOSALS.PRE_NMS_TOPK_TRAIN = 2000
    _C.PROPOSALS.PRE_NMS_TOPK_TEST = 1000
    # Proposals per image after NMS, in training and in inference.
    _C.PROPOSALS.POST_NMS_TOPK_TRAIN = 1000
    _C.PROPOSALS.POST_NMS_TOPK_TEST = 1000
    # IoU threshold of the class-agnostic NMS (RPN's MODEL.RPN.NMS_THRESH default).
    _C.PROPOSALS.NMS_THRESH = 0.7


    # Precision of backbone and head at inference: "float32", or "bfloat16" / "float16" to
    # run them under torch.autocast (bf16 suits CPUs with AVX512-BF16/AMX and recent GPUs,
    # fp16 GPUs); decoding, NMS and scores stay in float32. Training precision is
    # SOLVER.AMP.ENABLED (bf16 autocast on CPU, detectron2's fp16 AMP on GPU).
    _C.INFERENCE_DTYPE = "float32"
    # Where bf16 may run on a CPU, for SOLVER.AMP.ENABLED (training) and INFERENCE_DTYPE
    # "bfloat16": "auto" uses bf16 only on CPUs that compute it natively (AVX512-BF16 or AMX
    # on x86, BF16 on ARM) and float32 elsewhere, where bf16 is emulated and far slower,
    # saying so in one log line (docs/speed.md); "always" uses bf16 on any CPU. GPUs are
    # not affected.
    _C.CPU_BF16 = "auto"

    # Layout. Keep conv weights and the input batch in channels_last (NHWC), the layout
    # oneDNN's CPU convolutions and tensor-core GPU convolutions run fastest in; results are
    # the same up to float rounding (docs/speed.md).
    _C.CHANNELS_LAST = False
    # Train with the backbone and head compiled by torch.compile (inductor; a C++ compiler
    # on the CPU, triton on a GPU), in place: checkpoints and evaluation are unchanged
    # (fcos_d2/engine/compile.py). The first iteration compiles (minutes for an R-50 on a
    # CPU; docs/speed.md, python -m benchmarks.speed --rows compile).
    _C.COMPILE = False
    # Inference (the model in eval mode, evaluation, TTA, Predictor, demo, ONNX export)
    # runs a copy of the model with frozen BN and eval-mode BN folded into the convolutions
    # and channels_last memory, the same outputs within 1e-4, rebuilt when the weights
    # change (fcos_d2/modeling/fast_inference.py). False runs the model as trained.
    # Checkpoints always hold the unfolded weights.
    _C.FAST_INFERENCE = True
    # How backbone and head run in eval mode: "auto" picks from the CPU's native units and
    # the work ahead, in one log line (fcos_d2/modeling/backend_choice.py, docs/speed.md);
    # or "eager" (INFERENCE_DTYPE), "bf16_compiled" (torch.compile, bf16), "int8_pt2e"
    # (PT2E static int8, needs torchao; calibrated on the first 4 batches).
    _C.INFERENCE_BACKEND = "auto"
    # Where compiled backends keep inductor's caches, so a compile is paid once per machine;
    # "": $FCOS_D2_CACHE_DIR, else ~/.cache/fcos_d2 (fcos_d2/modeling/compile_cache.py).
    _C.COMPILE_CACHE_DIR = ""
    # Compiled backends pad a new input size (after the first) up to a ladder of this many
    # sizes per octave, so mixed sizes compile a few graphs (<= 1/N more per side); 0: exact.
    _C.INFERENCE_SIZE_BUCKETS = 8
    # bf16_compiled folds the weights into the graph as prepacked constants (fastest);
    # False keeps them inputs: new weights need no recompile, the whole compile is cached.
    _C.COMPILE_FREEZE_WEIGHTS = True


def add_solver_config(cfg: CN) -> None:
    """Adds ``SOLVER.OPTIMIZER`` and ``SOLVER.ADAMW_BETAS`` to ``cfg`` in place. Safe to
    call twice."""
    if "OPTIMIZER" not in cfg.SOLVER:
        # "SGD": detectron2's (SOLVER.MOMENTUM, NESTEROV). "ADAMW": torch.optim.AdamW with
        # the same parameter groups, lr schedule and gradient clipping.
        cfg.SOLVER.OPTIMIZER = "SGD"
    if "ADAMW_BETAS" not in cfg.SOLVER:
        cfg.SOLVER.ADAMW_BETAS = (0.9, 0.999)  # AdamW's (beta1, beta2)
    if "DEFORM_OFFSET_LR_FACTOR" not in cfg.SOLVER:
        # lr factor of the deformable convs' offset (and mask) predictors; 1.0: the base lr
        cfg.SOLVER.DEFORM_OFFSET_LR_FACTOR = 1.0
    add_schedule_config(cfg)


def add_schedule_config(cfg: CN) -> None:
    """Adds the schedule in epochs (fcos_d2/engine/schedule.py), the best checkpoint and
    early stopping (fcos_d2/engine/best.py) to ``cfg`` in place. Safe to call twice."""
    if "EPOCHS" in cfg.SOLVER:
        return
    # Length of the training in epochs (passes over the training set after its filtering;
    # e epochs take ceil(e * images / SOLVER.IMS_PER_BATCH) iterations). 0: SOLVER.MAX_ITER.
    # Each *_EPOCHS key below replaces its iteration key the same way; the config layer
    # (_BASE_ file, file, command line) that comes last decides the unit of a setting, and
    # one layer setting both keys of a setting is an error. Logged once with the numbers.
    cfg.SOLVER.EPOCHS = 0
    # Epochs at which the learning rate is multiplied by SOLVER.GAMMA (SOLVER.STEPS); () off.
    cfg.SOLVER.STEPS_EPOCHS = ()
    # Length of the warm-up in epochs (SOLVER.WARMUP_ITERS); a float, 0.0 off.
    cfg.SOLVER.WARMUP_EPOCHS = 0.0
    # Whole epochs between periodic checkpoints (SOLVER.CHECKPOINT_PERIOD); 0 off.
    cfg.SOLVER.CHECKPOINT_PERIOD_EPOCHS = 0
    # Whole epochs between evaluations (TEST.EVAL_PERIOD); 0 off.
    cfg.TEST.EVAL_PERIOD_EPOCHS = 0
    cfg.TEST.BEST_CHECKPOINT = CN()
    # With periodic evaluation (TEST.EVAL_PERIOD > 0), keep the weights of the best
    # evaluation so far in OUTPUT_DIR/model_best.pth (a checkpoint like any other).
    cfg.TEST.BEST_CHECKPOINT.ENABLED = True
    # The metric, as detectron2 flattens the results ("bbox/AP", "segm/AP50"; with several
    # DATASETS.TEST, "<dataset>/bbox/AP"). "": bbox/AP, segm/AP with MODEL.MASK_ON, of the
    # first test dataset.
    cfg.TEST.BEST_CHECKPOINT.METRIC = ""
    # "max" (higher is better, as AP) or "min".
    cfg.TEST.BEST_CHECKPOINT.MODE = "max"
    cfg.SOLVER.EARLY_STOP = CN()
    # Stop after PATIENCE evaluations in a row that did not beat the reference (the metric of
    # the last evaluation that did) by more than MIN_DELTA; 0 never stops early. The LR
    # schedule's last step is respected: evaluations until the last of SOLVER.STEPS do not
    # count, since the gain of that step only shows after it (docs/training_schedules.md).
    cfg.SOLVER.EARLY_STOP.PATIENCE = 0
    # The improvement that counts, in the metric's units (AP points).
    cfg.SOLVER.EARLY_STOP.MIN_DELTA = 0.0


def add_checkpoint_config(cfg: CN) -> None:
    """Adds the keys of how MODEL.WEIGHTS is loaded (fcos_d2.checkpoint). Safe to call twice."""
    if "WEIGHTS_ALLOW_PICKLE" not in cfg.MODEL:
        # Load weights or checkpoints that need plain pickle, i.e. name Python objects other
        # than tensors, numpy arrays, numbers and strings (old checkpoints holding a config
        # object, ...). A pickle can run code: only for files you trust. Detectron's .pkl
        # ImageNet weights and detectron2's checkpoints are data and load without it.
        cfg.MODEL.WEIGHTS_ALLOW_PICKLE = False
    if "WEIGHTS_SHA256" not in cfg.MODEL:
        # Expected sha256 of MODEL.WEIGHTS (local file or URL), or its first >= 6 hex digits;
        # "" checks URLs named "name-<sha256 prefix>.ext" (torch.hub's convention) only. A
        # download with another hash is deleted.
        cfg.MODEL.WEIGHTS_SHA256 = ""

