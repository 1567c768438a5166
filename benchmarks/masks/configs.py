"""The configs of the mask benchmark (``benchmarks.masks``): the base config, the data
regimes (``REGIMES``), the regime both contenders share, Mask R-CNN on SipMask's ResNet trunk
(``benchmarks.rcnn``), and the key a stored run must match to be reused."""
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from benchmarks.rcnn import faster_rcnn_overrides, register_trunk_fpn_backbone

REPO = Path(__file__).resolve().parents[2]
SIPMASK_CONFIG = REPO / "configs" / "quickstart-sipmask.yaml"
FALLBACK_CONFIG = REPO / "configs" / "quickstart.yaml"
TRAIN_NAME, VAL_NAME = "synthetic_masks_train", "synthetic_masks_val"
CONTENDERS = ("sipmask", "mask-rcnn")


@dataclass(frozen=True)
class MaskRegime:
    """The data of a mask benchmark regime: train and val sets (``fcos_d2.data``'s built-in
    sets with masks), val images scored by default, the keys the data needs on top of the
    base config, and the default output folder under output/."""

    train: str
    val: str
    val_images: int
    overrides: Tuple = ()
    output: str = "mask_quality"
    generator: str = "shapes"  # fcos_d2.data.synthetic ("shapes") or .synthetic_thin ("thin")


REGIMES: Dict[str, MaskRegime] = {
    # the mask quickstart's own data: 128-px shapes, 6 classes, 3000 train and 300 val images
    "quickstart": MaskRegime(TRAIN_NAME, VAL_NAME, 300),
    # the thin shapes with masks: 256-352 px images (each at its own size), 10 classes of
    # outlines, crosses, glyphs and filled shapes of 10-100 px; 400 train and 100 val images
    "thin": MaskRegime("synthetic_thin_masks_train", "synthetic_thin_masks_val", 100,
                       ("MODEL.FCOS.NUM_CLASSES", 10, "INPUT.MIN_SIZE_TRAIN", (256,),
                        "INPUT.MAX_SIZE_TRAIN", 352, "INPUT.MIN_SIZE_TEST", 256,
                        "INPUT.MAX_SIZE_TEST", 352), "mask_quality_thin", "thin"),
}


def regime_of(name: str) -> MaskRegime:
    if name not in REGIMES:
        raise ValueError(f"benchmarks.masks: unknown regime '{name}'; use one of "
                         f"{sorted(REGIMES)}")
    return REGIMES[name]


def base_config_file() -> Path:
    return SIPMASK_CONFIG if SIPMASK_CONFIG.is_file() else FALLBACK_CONFIG


def mask_rcnn_overrides(trunk_stages: List[str], num_classes: int, fpn_channels: int) -> List:
    """The keys that turn the base config into Mask R-CNN on the same ResNet trunk: Faster
    R-CNN's (``benchmarks.rcnn.faster_rcnn_overrides``) with detectron2's mask head.

    Args:
        trunk_stages: the base config's ``MODEL.RESNETS.OUT_FEATURES``; Mask R-CNN's FPN
            takes res2 up to the deepest of them.
        num_classes: foreground classes.
        fpn_channels: the FPN's width, also the mask head's.
    """
    return [
        *faster_rcnn_overrides(trunk_stages, num_classes),
        "MODEL.MASK_ON", True,
        "MODEL.ROI_MASK_HEAD.NAME", "MaskRCNNConvUpsampleHead",
        "MODEL.ROI_MASK_HEAD.NUM_CONV", 4,
        # as wide as the FPN (and the FCOS/SipMask head on it), not 256
        "MODEL.ROI_MASK_HEAD.CONV_DIM", fpn_channels,
        "MODEL.ROI_MASK_HEAD.POOLER_RESOLUTION", 14,
    ]


def schedule_overrides(cfg, iters: int) -> List:
    """MAX_ITER = ``iters``; lr steps, warm-up, evaluation and checkpoint periods scaled so
    that they keep their fractions of the base config's schedule."""
    scale = iters / cfg.SOLVER.MAX_ITER
    return ["SOLVER.MAX_ITER", iters,
            # increasing and inside the schedule, also when very short
            "SOLVER.STEPS", tuple(sorted({min(iters - 1, max(1, round(s * scale)))
                                          for s in cfg.SOLVER.STEPS})),
            "SOLVER.WARMUP_ITERS", max(1, round(cfg.SOLVER.WARMUP_ITERS * scale)),
            "SOLVER.CHECKPOINT_PERIOD", iters,  # only the final model
            "TEST.EVAL_PERIOD", 0]  # one evaluation, after the last iteration


def shared_regime(cfg) -> dict:
    """What both contenders must share, as JSON-ready values: data, input sizes, solver,
    seed, the ResNet trunk (its last stage) and pixel statistics. Runs are reused, and
    compared, only under an equal regime."""
    resnets = cfg.MODEL.RESNETS
    keys = {
        "DATASETS": [list(cfg.DATASETS.TRAIN), list(cfg.DATASETS.TEST)],
        "INPUT": [cfg.INPUT.MIN_SIZE_TRAIN, cfg.INPUT.MAX_SIZE_TRAIN, cfg.INPUT.MIN_SIZE_TEST,
                  cfg.INPUT.MAX_SIZE_TEST, cfg.INPUT.RANDOM_FLIP, cfg.INPUT.CROP.ENABLED,
                  cfg.INPUT.MASK_FORMAT, cfg.INPUT.FORMAT],
        "SOLVER": {k: v for k, v in cfg.SOLVER.items() if k != "CHECKPOINT_PERIOD"},
        "SEED": cfg.SEED,
        "TRUNK": [resnets.DEPTH, resnets.NORM, resnets.RES2_OUT_CHANNELS, resnets.NUM_GROUPS,
                  resnets.WIDTH_PER_GROUP, resnets.STRIDE_IN_1X1, max(resnets.OUT_FEATURES),
                  cfg.MODEL.BACKBONE.FREEZE_AT, cfg.MODEL.WEIGHTS, cfg.MODEL.FPN.OUT_CHANNELS],
        "PIXELS": [cfg.MODEL.PIXEL_MEAN, cfg.MODEL.PIXEL_STD],
    }
    return json.loads(json.dumps(keys, default=list))


# MODEL.FCOS keys that the trainer reads for every architecture (class count, precision,
# compilation); Mask R-CNN reads no other key of the FCOS and SipMask nodes
TRAINER_FCOS_KEYS = ("NUM_CLASSES", "CPU_BF16", "COMPILE")


def model_digest(cfg) -> str:
    """A digest of the ``MODEL`` keys the contender reads (its options, e.g.
    MODEL.FCOS.CLS_LOSS, are not part of the shared regime): a run is reused only for the
    same model. Mask R-CNN's digest leaves out the FCOS and SipMask options, so that a
    SipMask option does not retrain Mask R-CNN."""
    model = cfg.MODEL.clone()
    model.defrost()
    if model.META_ARCHITECTURE == "GeneralizedRCNN":
        model.FCOS = type(model)({k: model.FCOS[k] for k in TRAINER_FCOS_KEYS})
        model.pop("SIPMASK", None)
    # canonical JSON, not yacs' YAML dump: its aliases (&id001) depend on which lists the
    # config shares, e.g. FPN.IN_FEATURES written as an anchor of RESNETS.OUT_FEATURES
    text = json.dumps(model, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_key(cfg) -> dict:
    """What a stored run must match to be reused: the shared regime and the model."""
    return {"regime": shared_regime(cfg), "model": model_digest(cfg)}


def base_max_iter() -> int:
    """The base config's SOLVER.MAX_ITER: the schedule ``--iters`` defaults to."""
    from detectron2.config import get_cfg

    from fcos_d2 import add_fcos_config

    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(base_config_file()))
    return cfg.SOLVER.MAX_ITER


def val_dataset(val_images: Optional[int] = None, regime: str = "quickstart") -> str:
    """The name of the first ``val_images`` images of the regime's val set, registered (and
    generated) on first use; the whole split (``val_images`` None or all of them) is the
    regime's val set itself."""
    import fcos_d2  # noqa: F401  (before detectron2)
    from detectron2.data import DatasetCatalog

    from fcos_d2.data import register_coco_dataset, synthetic, synthetic_thin

    data = regime_of(regime)
    if val_images is None or val_images == data.val_images:
        return data.val
    name = f"{data.val}_first_{val_images}"
    if name not in DatasetCatalog.list():
        ensure = {"shapes": synthetic.ensure_synthetic_shapes,
                  "thin": synthetic_thin.ensure_synthetic_thin}[data.generator]
        folder = ensure("val", num_images=val_images, masks=True)
        register_coco_dataset(name, str(folder / synthetic.ANNOTATIONS_FILE),
                              str(folder / synthetic.IMAGES_FOLDER))
    return name


def setup_cfg(name: str, seed: int, output_dir: str, iters: int, opts: List,
              val_images: Optional[int] = None, regime: str = "quickstart"):
    """The config of contender ``name``: the base config, the data `regime`'s keys, the
    shared regime (scored on the first ``val_images`` val images, default all), then the
    contender's detector keys; ``opts`` last."""
    from detectron2.config import get_cfg

    from fcos_d2 import add_fcos_config

    if name not in CONTENDERS:
        raise ValueError(f"benchmarks.masks: unknown contender '{name}'; use one of {CONTENDERS}")
    register_trunk_fpn_backbone()
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(base_config_file()))
    data = regime_of(regime)
    cfg.merge_from_list(list(data.overrides))
    cfg.merge_from_list(["DATASETS.TRAIN", (data.train,),
                         "DATASETS.TEST", (val_dataset(val_images, regime),),
                         "MODEL.MASK_ON", True, "INPUT.MASK_FORMAT", "bitmask",
                         "DATALOADER.NUM_WORKERS", 0, "MODEL.DEVICE", "cpu", "SEED", seed,
                         "OUTPUT_DIR", output_dir, *schedule_overrides(cfg, iters)])
    if name == "mask-rcnn":
        cfg.merge_from_list(mask_rcnn_overrides(cfg.MODEL.RESNETS.OUT_FEATURES,
                                                cfg.MODEL.FCOS.NUM_CLASSES,
                                                cfg.MODEL.FPN.OUT_CHANNELS))
    cfg.merge_from_list(opts)
    cfg.freeze()
    return cfg
