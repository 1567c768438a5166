#!/usr/bin/env python
"""Trains and evaluates a LazyConfig (a Python config file) of FCOS, in the manner of
detectron2's tools/lazyconfig_train_net.py.

    python tools/lazyconfig_train_net.py --config-file configs/lazy/fcos_R_50_FPN_1x.py --num-gpus 8
    python tools/lazyconfig_train_net.py --config-file configs/lazy/quickstart.py \
        train.max_iter=100 dataloader.train.total_batch_size=4
    python tools/lazyconfig_train_net.py --config-file configs/lazy/quickstart.py --eval-only \
        train.init_checkpoint=output/quickstart_lazy/model_final.pth

The config provides the nodes of detectron2's LazyConfigs: ``model``, ``dataloader.train``,
``dataloader.test``, ``dataloader.evaluator``, ``optimizer`` (its ``params.model`` is set
here), ``lr_multiplier`` and ``train`` (output_dir, init_checkpoint, max_iter, amp, ddp,
checkpointer, eval_period, log_period, device). Overrides are ``key=value``.
"""
import logging
import os

import fcos_d2  # noqa: F401  (first: detectron2 v0.6 shims; registers FCOS and datasets)
import torch
from detectron2.config import LazyConfig, instantiate
from detectron2.engine import (AMPTrainer, SimpleTrainer, create_ddp_model,
                               default_argument_parser, default_setup, default_writers, hooks)
from detectron2.evaluation import inference_on_dataset, print_csv_format
from detectron2.utils import comm

from fcos_d2.checkpoint import FCOSCheckpointer
from fcos_d2.data import prepare_dataset
from fcos_d2.engine import CPUAMPTrainer
from fcos_d2.engine.amp import cpu_autocast_dtype
from fcos_d2.engine.final_checkpoint import ProveFinalCheckpoint
from fcos_d2.engine.heartbeat import ReportProgress
from fcos_d2.engine.hooks import WarnOnLowDiskSpace
from fcos_d2.engine.launch import add_launcher_arguments, launch_from_args
from fcos_d2.engine.preemption import SaveOnPreemption
from fcos_d2.engine.slurm import apply_slurm_environment
from fcos_d2.modeling.fast_inference import inference_model

logger = logging.getLogger("fcos_d2")


def do_test(cfg, model):
    """Evaluates ``model`` on ``dataloader.test`` with ``dataloader.evaluator``."""
    if "evaluator" not in cfg.dataloader:
        return {}
    prepare_dataset(cfg.dataloader.evaluator.dataset_name)  # COCOEvaluator reads its json
    # a folded, channels_last copy unless train.fast_inference is False (as
    # MODEL.FCOS.FAST_INFERENCE in the yaml configs; fcos_d2.modeling.fast_inference)
    model = inference_model(model, cfg.train.get("fast_inference", True))
    results = inference_on_dataset(model, instantiate(cfg.dataloader.test),
                                   instantiate(cfg.dataloader.evaluator))
    if comm.is_main_process():
        print_csv_format(results)
    return results


def _ddp_model(model, cfg):
    ddp = dict(cfg.train.ddp)
    if cfg.train.device == "cpu":  # DistributedDataParallel takes no device ids on the CPU
        ddp["device_ids"] = None
    return create_ddp_model(model, **ddp)


def _trainer_class(cfg):
    """SimpleTrainer; with train.amp.enabled, detectron2's AMPTrainer on a GPU and
    CPUAMPTrainer (bf16 autocast, no gradient scaler) on the CPU, in float32 where the CPU
    has no native bf16 unless train.amp.cpu_bf16 is "always"."""
    if not cfg.train.amp.enabled:
        return SimpleTrainer
    return CPUAMPTrainer if torch.device(cfg.train.device).type == "cpu" else AMPTrainer


def do_train(args, cfg) -> None:
    """Builds model, optimizer, data and hooks from ``cfg``, then trains to train.max_iter."""
    from fcos_d2.engine.schedule import LAZY_SCHEDULE_KEYS, ScheduleOnResume, schedule_record

    model = instantiate(cfg.model).to(cfg.train.device)
    logger.info("Model:\n%s", model)
    cfg.optimizer.params.model = model
    optimizer = instantiate(cfg.optimizer)
    train_loader = instantiate(cfg.dataloader.train)
    model = _ddp_model(model, cfg)
    trainer = _trainer_class(cfg)(model, train_loader, optimizer)
    if isinstance(trainer, CPUAMPTrainer):  # bf16 only where native, as in train_net.py
        trainer.precision = cpu_autocast_dtype(torch.bfloat16, cfg.train.amp.get("cpu_bf16", "auto"),
                                               what="training", key="train.amp.enabled")
    checkpointer = FCOSCheckpointer(model, cfg.train.output_dir, trainer=trainer)
    main_process = comm.is_main_process()
    trainer.register_hooks([
        hooks.IterationTimer(),
        ReportProgress(),
        WarnOnLowDiskSpace(checkpointer),
        hooks.LRScheduler(scheduler=instantiate(cfg.lr_multiplier)),
        hooks.PeriodicCheckpointer(checkpointer, **cfg.train.checkpointer) if main_process
        else None,
        SaveOnPreemption(checkpointer),  # no data-stream state: resumes, but not exactly
        ScheduleOnResume(schedule_record(cfg, LAZY_SCHEDULE_KEYS,  # checked on --resume
                                         "dataloader.train.total_batch_size")),
        ProveFinalCheckpoint(checkpointer),  # model_final.pth verified, or a non-zero exit
        hooks.EvalHook(cfg.train.eval_period, lambda: do_test(cfg, model)),
        hooks.PeriodicWriter(default_writers(cfg.train.output_dir, cfg.train.max_iter),
                             period=cfg.train.log_period) if main_process else None,
    ])
    checkpointer.resume_or_load(cfg.train.init_checkpoint, resume=args.resume)
    start_iter = trainer.iter + 1 if args.resume and checkpointer.has_checkpoint() else 0
    trainer.train(start_iter, cfg.train.max_iter)


def setup(args):
    """Loads the config, applies the ``key=value`` overrides and the schedule in epochs
    (train.epochs & co.; fcos_d2/engine/schedule.py), falls back to the CPU."""
    from fcos_d2.engine.schedule import apply_lazy_epoch_schedule

    cfg = LazyConfig.load(args.config_file)
    cfg = LazyConfig.apply_overrides(cfg, args.opts)
    fallback = ""
    if cfg.train.device.startswith("cuda") and not torch.cuda.is_available():
        fallback = f"CUDA is not available: train.device {cfg.train.device} -> cpu"
        cfg.train.device = "cpu"
    schedule = None if args.eval_only else apply_lazy_epoch_schedule(  # train.epochs & co.
        cfg, args.config_file, args.opts, comm.get_world_size())
    default_setup(cfg, args)
    if fallback:
        logger.warning(fallback)
    if schedule is not None:
        logger.info(schedule.describe())
    return cfg


def main(args):
    cfg = setup(args)
    if args.eval_only:
        model = instantiate(cfg.model).to(cfg.train.device)
        model = _ddp_model(model, cfg)
        FCOSCheckpointer(model).load(cfg.train.init_checkpoint)
        return do_test(cfg, model)
    do_train(args, cfg)
    return None


if __name__ == "__main__":
    args = apply_slurm_environment(add_launcher_arguments(default_argument_parser()), None,
                                   os.environ)  # flags, else srun's environment
    launch_from_args(main, args)
