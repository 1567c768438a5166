"""The training-quality protocol: what every contender gets alike.

The regimes (data, their config overrides, default seeds and output folder), the config of
a run (the recipe config, the regime, the schedule ``REGIME``, then the contender's own
overrides, then the command's), training with one loader, optimizer and schedule, and COCO
box evaluation. This module knows no contender: a contender hands it its overrides and a
``build(cfg) -> model`` function (``benchmarks.train_quality.contenders``).
"""
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

from benchmarks.runner import iteration_progress, loss_recorder

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "FCOS-R18-small-data.yaml"
# Half the recipe's 1200 iterations, so that a run takes a few minutes on one CPU core; the
# warm-up stays the protocol's 50 for every contender, as in every table measured with it.
REGIME = ["SOLVER.MAX_ITER", 600, "SOLVER.STEPS", (500,), "SOLVER.WARMUP_ITERS", 50]
# The recipe config's schedule is in epochs since 2026-12-05; the protocol's is in
# iterations (REGIME), so its epoch keys are off (the protocol trains without deriving them).
EPOCH_KEYS_OFF = ["SOLVER.EPOCHS", 0, "SOLVER.STEPS_EPOCHS", (), "SOLVER.WARMUP_EPOCHS", 0.0,
                  "SOLVER.CHECKPOINT_PERIOD_EPOCHS", 0, "TEST.EVAL_PERIOD_EPOCHS", 0]
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
    # 128-px shapes, 6 classes (the first table of docs/small_data.md)
    "shapes": Regime(DATASETS, "shapes"),
    # 256-352 px images, 10 classes of thin and filled objects of 10-100 px, each image
    # at its own size: closer to the held-out data of issue 20
    "thin": Regime((("train_quality_thin_train", "train", TRAIN_IMAGES),
                    ("train_quality_thin_val", "val", VAL_IMAGES)), "thin",
                   ("MODEL.FCOS.NUM_CLASSES", 10, "INPUT.MIN_SIZE_TRAIN", (256,),
                    "INPUT.MAX_SIZE_TRAIN", 352, "INPUT.MIN_SIZE_TEST", 256,
                    "INPUT.MAX_SIZE_TEST", 352), (0, 1, 2, 3, 4), "train_quality_thin"),
}


def setup_cfg(seed: int, output_dir: str, *, regime: str = "shapes", schedule: Sequence = (),
              overrides: Sequence = (), step: Sequence = (), opts: Sequence = ()):
    """The frozen config of a run in `regime`: the recipe config, the regime's data, the
    protocol's schedule and a contender's `schedule`, then its `overrides` (so that a variant
    may change the schedule too), then its training step's `step` (LabelEnc), then `opts`
    (the command's)."""
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
                         "OUTPUT_DIR", output_dir, *EPOCH_KEYS_OFF, *REGIME, *schedule])
    cfg.merge_from_list(list(overrides))
    cfg.merge_from_list(list(step))
    cfg.merge_from_list(list(opts))
    extend_step1_schedule(cfg)  # as the trainer: LabelEnc's step 1 adds its warm-up
    cfg.freeze()
    return cfg


def ensure_split(regime: str, split: str, count: int) -> Path:
    """The folder of the first `count` images of `split` of the regime's synthetic set,
    generated unless cached."""
    from fcos_d2.data.synthetic import ensure_synthetic_shapes
    from fcos_d2.data.synthetic_thin import ensure_synthetic_thin

    ensure = {"shapes": ensure_synthetic_shapes, "thin": ensure_synthetic_thin}
    return ensure[REGIMES[regime].generator](split, num_images=count)


def register_datasets(regime: str = "shapes") -> None:
    """Registers the regime's train and val datasets (generated unless cached)."""
    from fcos_d2.data import register_coco_dataset
    from fcos_d2.data.synthetic import ANNOTATIONS_FILE, IMAGES_FOLDER

    for name, split, count in REGIMES[regime].datasets:
        folder = ensure_split(regime, split, count)
        register_coco_dataset(name, str(folder / ANNOTATIONS_FILE), str(folder / IMAGES_FOLDER))


def prepare_datasets(regime: str = "shapes") -> None:
    """Generates the regime's data once, in the parent, so that runs never race to."""
    import fcos_d2  # noqa: F401

    for _, split, count in REGIMES[regime].datasets:
        ensure_split(regime, split, count)


def train(build: Callable, cfg, seed: int, init: Optional[Callable] = None,
          diagnostics: bool = False, init_seed: Optional[int] = None,
          checkpoint_dir: Optional[str] = None):
    """Builds the model (``build(cfg)``, then ``init(model)`` if given) and trains it with
    the protocol's loader, optimizer and schedule (in bf16 autocast with
    ``SOLVER.AMP.ENABLED`` where the CPU has native bf16, as train_net.py); returns it and a dict of the run's seed,
    status, final losses, training seconds and iterations done (with `diagnostics`, also
    "diagnostics": losses, positives per level, gradient norms, BN statistics, regression
    outputs and positives' scores, from ``benchmarks.train_quality.diagnostics``).

    `seed` seeds every generator (detectron2's ``seed_all_rng``); `init_seed`, if given,
    then reseeds torch's alone. Torch's generator draws the initial weights and numpy's the
    image order (``TrainingSampler``'s seed) and the augmentation, so the two seeds split a
    run's randomness into initialisation and data; ``init_seed == seed`` is the plain run.

    With `checkpoint_dir` (and without `diagnostics`, whose statistics are not saved), the
    run saves where it is there every ``resume.CHECKPOINT_SECONDS`` of training and, when
    its file is there already, resumes from it (``benchmarks.train_quality.resume``): its
    "train_seconds" then count every attempt, and "resumed" says where each began."""
    import torch
    from detectron2.data import build_detection_train_loader
    from detectron2.engine import SimpleTrainer, hooks
    from detectron2.solver import build_lr_scheduler
    from detectron2.utils.env import seed_all_rng

    from fcos_d2.engine.amp import CPUAMPTrainer, cpu_autocast_dtype
    from fcos_d2.engine.optimizer import build_optimizer  # SOLVER.OPTIMIZER: SGD or AdamW

    seed_all_rng(seed)
    if init_seed is not None:
        torch.manual_seed(init_seed)
    model = build(cfg)
    if init is not None:
        init(model)
    optimizer = build_optimizer(cfg, model)
    trainer = SimpleTrainer(model, build_detection_train_loader(cfg), optimizer)
    if cfg.SOLVER.AMP.ENABLED and cfg.MODEL.DEVICE == "cpu":  # as train_net.py's Trainer
        trainer = CPUAMPTrainer.replacing(trainer, cpu_autocast_dtype(
            torch.bfloat16, cfg.MODEL.FCOS.CPU_BF16, what="training", key="SOLVER.AMP.ENABLED"))
    recorder, scheduler = loss_recorder(), build_lr_scheduler(cfg, optimizer)
    trainer.register_hooks([hooks.LRScheduler(optimizer, scheduler), recorder,
                            iteration_progress()])
    if diagnostics:
        from benchmarks.train_quality.diagnostics import TrainingDiagnostics

        watcher = TrainingDiagnostics(model)
        trainer.register_hooks([watcher])
    start = time.perf_counter()
    checkpoint = None if diagnostics or checkpoint_dir is None else _checkpointing(
        trainer, cfg, Path(checkpoint_dir), scheduler, recorder)
    status = "ok"
    try:
        trainer.train(checkpoint.start_iter if checkpoint else 0, cfg.SOLVER.MAX_ITER)
    except FloatingPointError as error:  # SimpleTrainer's check of non-finite losses
        status = f"diverged: {error}"
    seconds = checkpoint.seconds() if checkpoint else time.perf_counter() - start
    # trainer.iter: the iterations done, MAX_ITER unless a non-finite loss stopped it
    record = {"seed": seed, "status": status, "final_losses": recorder.tail(),
              "train_seconds": round(seconds, 1), "iterations": trainer.iter,
              **({"resumed": checkpoint.resumed} if checkpoint and checkpoint.resumed else {})}
    if diagnostics:
        record["diagnostics"] = watcher.record()
    return model, record


def _checkpointing(trainer, cfg, folder: Path, scheduler, recorder):
    """The run's ``resume.RunCheckpoint`` hook (registered last) in `folder`, with
    ``start_iter``: where `trainer` was put back to from the folder's saved state (0
    without one)."""
    from benchmarks.train_quality import resume

    config = cfg.dump()
    state = resume.resume_state(folder / resume.RESUME_FILE, config)
    notes = [*state["resumed"], resume.restore(trainer, state, scheduler, recorder)] \
        if state else []
    checkpoint = resume.RunCheckpoint(folder / resume.RESUME_FILE, scheduler=scheduler,
                                      recorder=recorder, config=config,
                                      seconds_before=state["seconds"] if state else 0.0,
                                      resumed=notes, period_seconds=resume.CHECKPOINT_SECONDS)
    checkpoint.start_iter = state["iteration"] if state else 0
    trainer.register_hooks([checkpoint])
    return checkpoint


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
        loader = build_detection_test_loader(cfg, val_name, mapper=mapper)
        metrics = inference_on_dataset(model, loader, evaluator)["bbox"]
    return {"AP": metrics["AP"], "AP50": metrics["AP50"], "APs": metrics.get("APs")}
