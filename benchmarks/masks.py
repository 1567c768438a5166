#!/usr/bin/env python
"""Mask quality and speed: SipMask against detectron2's Mask R-CNN, trained from scratch.

Both train on ``synthetic_masks_train`` and are scored on ``synthetic_masks_val`` (300
images, or its first ``--val-images``) by train_net.py's ``Trainer``: the same data loader
and mapper (masks as ``INPUT.MASK_FORMAT`` says), optimizer, schedule, seed, precision and
``COCOEvaluator`` (bbox and segm). Everything but the detector comes from one base config
(``configs/quickstart-sipmask.yaml``; ``configs/quickstart.yaml`` with masks where the
SipMask config is missing): the ResNet trunk (depth, norm, stages), pixel statistics,
input sizes, solver and AMP. On top of it:

- ``sipmask``: the base config as it is (``MODEL.META_ARCHITECTURE: SipMask``);
- ``mask-rcnn``: detectron2's ``GeneralizedRCNN`` with its ResNet-FPN backbone on the same
  trunk (FPN from res2 up to the trunk's last stage, plus a max-pooled level above it, as
  detectron2's Mask R-CNN FPN has), RPN, box head (2 FC) and mask head
  (``MaskRCNNConvUpsampleHead``, 4 convs, 28 x 28 masks), as detectron2's
  ``Base-RCNN-FPN.yaml`` except the anchor sizes (one octave per level from 16 px, for the
  8-124 px objects), 128 sampled proposals per image instead of 512 (at most 6 objects
  an image) and mask-head convs as wide as the FPN (SipMask's head width) instead of 256.

The schedule is the base config's, or that schedule scaled to ``--iters``: MAX_ITER
becomes ``--iters``, the lr steps and warm-up keep their fractions of it.

Each (contender, seed) runs in its own process with one thread, ``--jobs`` at a time
(tools/train_quality.py's runner); results go to ``OUTPUT/results.jsonl`` (runs found
there under the same shared regime and the same model, ``model_digest``, are not
repeated). Then one process times inference of both contenders' seed-0 models side by
side, one image at a time on one thread, alternating between them image by image
(``--latency-images`` val images, after a warm-up), and the table (mask AP mean, sample
std and range over seeds, box AP, median latency per image) is printed and written to
``OUTPUT/table.md``.

Usage:
    python tools/mask_quality.py [--contenders sipmask mask-rcnn] [--seeds 0 1 2]
        [--iters N] [--val-images N] [--jobs 2] [--output DIR] [KEY VALUE ...]
"""
import argparse
import hashlib
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

SIPMASK_CONFIG = REPO / "configs" / "quickstart-sipmask.yaml"
FALLBACK_CONFIG = REPO / "configs" / "quickstart.yaml"
TRAIN_NAME, VAL_NAME = "synthetic_masks_train", "synthetic_masks_val"
CONTENDERS = ("sipmask", "mask-rcnn")
METRICS = ("AP", "AP50", "AP75")


# ---------------------------------------------------------------- configs

def base_config_file() -> Path:
    return SIPMASK_CONFIG if SIPMASK_CONFIG.is_file() else FALLBACK_CONFIG


def mask_rcnn_overrides(trunk_stages: List[str], num_classes: int, fpn_channels: int) -> List:
    """The keys that turn the base config into Mask R-CNN on the same ResNet trunk.

    Args:
        trunk_stages: the base config's ``MODEL.RESNETS.OUT_FEATURES``; Mask R-CNN's FPN
            takes res2 up to the deepest of them.
        num_classes: foreground classes.
        fpn_channels: the FPN's width, also the mask head's.
    """
    order = ["res2", "res3", "res4", "res5"]
    stages = order[:max(order.index(s) for s in trunk_stages) + 1]
    levels = [f"p{int(s[-1])}" for s in stages]  # p2 ... from res2 ...
    rpn_levels = levels + [f"p{int(levels[-1][1:]) + 1}"]  # + the max-pooled top level
    return [
        "MODEL.META_ARCHITECTURE", "GeneralizedRCNN",
        "MODEL.MASK_ON", True,
        "MODEL.BACKBONE.NAME", "build_resnet_trunk_fpn_backbone",
        "MODEL.RESNETS.OUT_FEATURES", stages,
        "MODEL.FPN.IN_FEATURES", stages,
        "MODEL.ANCHOR_GENERATOR.SIZES", [[16 * 2 ** i] for i in range(len(rpn_levels))],
        "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS", [[0.5, 1.0, 2.0]],
        "MODEL.PROPOSAL_GENERATOR.NAME", "RPN",
        "MODEL.RPN.IN_FEATURES", rpn_levels,
        # detectron2's Base-RCNN-FPN.yaml: per level before NMS, in all after it
        "MODEL.RPN.PRE_NMS_TOPK_TRAIN", 2000, "MODEL.RPN.PRE_NMS_TOPK_TEST", 1000,
        "MODEL.RPN.POST_NMS_TOPK_TRAIN", 1000, "MODEL.RPN.POST_NMS_TOPK_TEST", 1000,
        "MODEL.ROI_HEADS.NAME", "StandardROIHeads",
        "MODEL.ROI_HEADS.IN_FEATURES", levels,
        "MODEL.ROI_HEADS.NUM_CLASSES", num_classes,
        # 128 sampled proposals per image, not 512: at most 6 objects per image, and 512
        # made the box head's FC layers most of a training step's time
        "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", 128,
        "MODEL.ROI_BOX_HEAD.NAME", "FastRCNNConvFCHead",
        "MODEL.ROI_BOX_HEAD.NUM_FC", 2,
        "MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION", 7,
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


# MODEL.FCOS keys that train_net reads for every architecture (class count, precision,
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


def val_dataset(val_images: int) -> str:
    """The name of the first ``val_images`` images of ``synthetic_masks_val``, registered
    (and generated) on first use; the whole split is ``synthetic_masks_val`` itself."""
    import fcos_d2  # noqa: F401  (before detectron2)
    from detectron2.data import DatasetCatalog

    from fcos_d2.data import register_coco_dataset, synthetic

    if val_images == synthetic.NUM_IMAGES["val"]:
        return VAL_NAME
    name = f"{VAL_NAME}_first_{val_images}"
    if name not in DatasetCatalog.list():
        folder = synthetic.ensure_synthetic_shapes("val", num_images=val_images, masks=True)
        register_coco_dataset(name, str(folder / synthetic.ANNOTATIONS_FILE),
                              str(folder / synthetic.IMAGES_FOLDER))
    return name


def setup_cfg(name: str, seed: int, output_dir: str, iters: int, opts: List,
              val_images: int = 300):
    """The config of contender ``name``: the base config, the shared regime (scored on
    the first ``val_images`` val images), then the contender's detector keys; ``opts``
    last."""
    from detectron2.config import get_cfg

    from fcos_d2 import add_fcos_config

    if name not in CONTENDERS:
        raise ValueError(f"mask_quality: unknown contender '{name}'; use one of {CONTENDERS}")
    _register_backbone()
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(base_config_file()))
    cfg.merge_from_list(["DATASETS.TRAIN", (TRAIN_NAME,),
                         "DATASETS.TEST", (val_dataset(val_images),),
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


def build_resnet_trunk_fpn_backbone(cfg, input_shape):
    """detectron2's ``build_resnet_fpn_backbone`` for any last stage: FPN over
    ``MODEL.FPN.IN_FEATURES`` and a max-pooled level above the last (detectron2's builder
    pools P5 only, so it needs res5)."""
    from detectron2.modeling.backbone import FPN, build_resnet_backbone
    from detectron2.modeling.backbone.fpn import LastLevelMaxPool

    top_block = LastLevelMaxPool()
    top_block.in_feature = f"p{cfg.MODEL.FPN.IN_FEATURES[-1][-1]}"  # res4 -> p4
    return FPN(bottom_up=build_resnet_backbone(cfg, input_shape),
               in_features=cfg.MODEL.FPN.IN_FEATURES, out_channels=cfg.MODEL.FPN.OUT_CHANNELS,
               norm=cfg.MODEL.FPN.NORM, top_block=top_block, fuse_type=cfg.MODEL.FPN.FUSE_TYPE)


def _register_backbone() -> None:
    import fcos_d2  # noqa: F401  (before detectron2)
    from detectron2.modeling import BACKBONE_REGISTRY

    if "build_resnet_trunk_fpn_backbone" not in BACKBONE_REGISTRY:
        BACKBONE_REGISTRY.register(build_resnet_trunk_fpn_backbone)


# ---------------------------------------------------------------- one run (child process)

def run_one(name: str, seed: int, output_dir: str, iters: int, opts: List,
            val_images: int = 300) -> dict:
    """Trains contender ``name`` with ``seed`` through train_net's Trainer; returns its box
    and mask metrics, final losses and training time."""
    import torch
    from detectron2.utils.env import seed_all_rng

    from train_net import Trainer
    from train_quality import _loss_recorder

    torch.set_num_threads(1)
    base_config = base_config_file().name
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    cfg = setup_cfg(name, seed, output_dir, iters, opts, val_images)
    seed_all_rng(seed)
    trainer = Trainer(cfg)
    recorder = _loss_recorder()
    trainer.register_hooks([recorder])
    trainer.resume_or_load(resume=False)
    start = time.perf_counter()
    status = "ok"
    try:
        trainer.train()  # returns the evaluation only with TEST.EXPECTED_RESULTS set
    except FloatingPointError as error:  # a non-finite loss (StopOnNonFiniteLoss)
        status = f"diverged: {error}"
    seconds = time.perf_counter() - start
    latest = trainer.storage.latest()  # the final evaluation put "bbox/AP", "segm/AP", ...
    scores = {task: {m: latest[f"{task}/{m}"][0] if f"{task}/{m}" in latest else math.nan
                     for m in METRICS} for task in ("bbox", "segm")}
    return {"contender": name, "seed": seed, "status": status, "box": scores["bbox"],
            "mask": scores["segm"],
            "final_losses": {k: v for k, v in recorder.tail().items() if k.startswith("loss")},
            "train_and_eval_seconds": round(seconds, 1), "iters": iters,
            "base_config": base_config, "commit": commit, **run_key(cfg)}


# ---------------------------------------------------------------- latency (one process)

def measure_latency(names: List[str], output: Path, iters: int, opts: List,
                    num_images: int, val_images: int = 300,
                    warmup: int = 5) -> Dict[str, dict]:
    """Median inference seconds per image of each contender's seed-0 model, timed side by
    side: one thread, batch 1, the contenders alternating image by image.

    Returns:
        name -> {"median_s", "images"}; contenders without a seed-0 model are left out,
        and nothing is timed (no model is built) when ``num_images`` is 0.
    """
    if num_images < 1:
        return {}
    import torch
    from detectron2.modeling import build_model

    from fcos_d2.checkpoint import FCOSCheckpointer
    from train_net import Trainer

    torch.set_num_threads(1)
    models = {}
    for name in names:
        weights = output / "runs" / f"{name}-0" / "model_final.pth"
        if weights.is_file():
            cfg = setup_cfg(name, 0, str(output / "runs" / f"{name}-0"), iters, opts,
                            val_images)
            models[name] = build_model(cfg).eval()
            FCOSCheckpointer(models[name]).load(str(weights))
    if not models:
        return {}
    loader = Trainer.build_test_loader(cfg, cfg.DATASETS.TEST[0])  # the same for all
    inputs = [batch for batch, _ in zip(loader, range(num_images + warmup))]
    times: Dict[str, List[float]] = {name: [] for name in models}
    with torch.no_grad():
        for index, batch in enumerate(inputs):
            for name, model in models.items():
                start = time.perf_counter()
                model(batch)
                if index >= warmup:
                    times[name].append(time.perf_counter() - start)
    return {name: {"median_s": statistics.median(t), "images": len(t)}
            for name, t in times.items()}


# ---------------------------------------------------------------- table

def summarise(results: List[dict], latency: Dict[str, dict], names: List[str]) -> str:
    """A markdown table: per contender, mask AP mean / sample std / range over seeds, mask
    AP50 and AP75 means, box AP mean and std, and the median latency per image."""
    rows = ["| contender | seeds | mask AP mean | mask AP std | mask AP min-max | mask AP50 | "
            "mask AP75 | box AP mean | box AP std | ms / image |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        runs = sorted((r for r in results if r["contender"] == name), key=lambda r: r["seed"])
        if not runs:
            continue
        mask, box = [r["mask"]["AP"] for r in runs], [r["box"]["AP"] for r in runs]
        notes = "; ".join(f"seed {r['seed']} {r['status']}" for r in runs if r["status"] != "ok")
        ms = latency.get(name, {}).get("median_s")
        rows.append(
            f"| {name}{' (' + notes + ')' if notes else ''} | "
            f"{','.join(str(r['seed']) for r in runs)} | {statistics.mean(mask):.1f} | "
            f"{_std(mask):.1f} | {min(mask):.1f}-{max(mask):.1f} | "
            f"{statistics.mean(r['mask']['AP50'] for r in runs):.1f} | "
            f"{statistics.mean(r['mask']['AP75'] for r in runs):.1f} | "
            f"{statistics.mean(box):.1f} | {_std(box):.1f} | "
            f"{'n/a' if ms is None else f'{1000 * ms:.1f}'} |")
    return "\n".join(rows)


def _std(values: List[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else float("nan")


# ---------------------------------------------------------------- driver

def main(argv=None) -> str:
    args = _parser().parse_args(argv)
    output = Path(args.output)
    if args.run:
        import fcos_d2  # noqa: F401  (before detectron2)

        result = run_one(args.run, args.seed, str(output / "runs" / f"{args.run}-{args.seed}"),
                         args.iters, args.opts, args.val_images)
        with open(output / "results.jsonl", "a") as f:
            f.write(json.dumps(result) + "\n")
        return ""
    import fcos_d2  # noqa: F401
    from fcos_d2.data import prepare_dataset
    from train_quality import _run_all, load_results

    if args.iters is None:
        args.iters = base_max_iter()
    names = list(args.contenders)
    if "sipmask" in names and not SIPMASK_CONFIG.is_file():
        print(f"{SIPMASK_CONFIG.relative_to(REPO)} is missing: the 'sipmask' contender is "
              "left out", flush=True)
        names.remove("sipmask")
    output.mkdir(parents=True, exist_ok=True)
    prepare_dataset(TRAIN_NAME)  # once here, so that the runs never race to make them
    val_dataset(args.val_images)
    results_file = output / "results.jsonl"
    keys = {(c, s): run_key(setup_cfg(c, s, "", args.iters, args.opts, args.val_images))
            for c in names for s in args.seeds}

    def matches(row: dict) -> bool:  # rows stored without a model digest run again
        key = {"regime": row["regime"], "model": row.get("model")}
        return keys.get((row["contender"], row["seed"])) == key

    valid = [r for r in load_results(results_file) if matches(r)]
    done = {(r["contender"], r["seed"]) for r in valid}
    todo = [(c, s) for s in args.seeds for c in names if (c, s) not in done]
    _run_all(todo, args.jobs, output, ["--iters", str(args.iters), "--val-images",
                                        str(args.val_images), *args.opts], script=__file__)
    latency = measure_latency(names, output, args.iters, args.opts, args.latency_images,
                              args.val_images)
    (output / "latency.json").write_text(json.dumps(latency, indent=1) + "\n")
    valid = [r for r in load_results(results_file) if matches(r)]
    table = summarise(valid, latency, list(CONTENDERS))
    (output / "table.md").write_text(table + "\n")
    print(table)
    return table


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS),
                        choices=CONTENDERS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--iters", type=int, default=None,
                        help="training iterations of every run (the base schedule scaled); "
                             "default: the base config's SOLVER.MAX_ITER")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    parser.add_argument("--val-images", type=int, default=300,
                        help="score on the first N images of synthetic_masks_val (all 300)")
    parser.add_argument("--latency-images", type=int, default=100,
                        help="val images timed per contender (0: none)")
    parser.add_argument("--output", default=str(REPO / "output" / "mask_quality"))
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[],
                        help="config overrides for every contender (KEY VALUE ...); use a "
                             "separate --output for runs with other overrides")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # child: one contender ...
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)  # ... and one seed
    return parser


if __name__ == "__main__":
    main()
