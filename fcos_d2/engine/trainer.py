"""The library trainer of fcos-d2: ``Trainer`` (detectron2's DefaultTrainer with fcos-d2's
loaders, evaluators, hooks and checkpointer), ``setup`` (the config from command-line
arguments), ``main`` and ``argument_parser``. ``train_net.py`` and the ``fcos-d2-train``
command are thin wrappers around them; tools and tests import them from here.

The trainer names no member of the family: the model is detectron2's ``build_model`` of
MODEL.META_ARCHITECTURE (members register theirs), and what a member adds to training and
evaluation comes from the trainer extensions registered for the config
(``fcos_d2.trainer_extensions``), registered by the members themselves.

    python train_net.py --config-file configs/FCOS-R50.yaml --num-gpus 8
    python train_net.py --config-file configs/FCOS-R50.yaml --eval-only MODEL.WEIGHTS model.pth
    python train_net.py --config-file configs/FCOS-R50.yaml --eval-only MODEL.WEIGHTS model.pth \
        TEST.AUG.ENABLED True   # also with test-time augmentation: results "<task>_TTA"
    torchrun --nproc-per-node 8 train_net.py --config-file configs/FCOS-R50.yaml

Every evaluation appends a block to OUTPUT_DIR/inference/<dataset>/summary.txt.
"""
import logging
import os
import sys
import warnings
from collections import OrderedDict
from typing import List, Optional

import torch
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog, build_detection_test_loader
from detectron2.engine import DefaultTrainer, default_argument_parser, default_setup, hooks
from detectron2.evaluation import verify_results
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger

from .. import compat
from ..checkpoint import FCOSCheckpointer
from ..config import add_fcos_config
from ..data import prepare_dataset
from ..data.boxes import filter_invalid_boxes_on_load
from ..data.mapper import FCOSDatasetMapper
from ..data.register import check_num_classes, register_coco_dataset
from ..evaluation import append_summaries, expected_results_verdict, iterations_trained
from ..modeling import FCOSWithTTA
from ..modeling.fast_inference import fast_inference_enabled, inference_model
from ..parallel import unwrap_ddp
from ..evaluation.report import ReportOptions
from ..evaluation.report.evaluator import ReportingCOCOEvaluator
from ..trainer_extensions import trainer_extensions_for
from ..visualization import save_loader_predictions
from .amp import CPUAMPTrainer, cpu_autocast_dtype
from .best import EarlyStop, KeepBestCheckpoint
from .schedule import ScheduleOnResume, apply_epoch_schedule, config_layers, schedule_record
from .compile import ReportCompileTime, compile_in_place
from .final_checkpoint import ProveFinalCheckpoint
from .heartbeat import ReportProgress
from .hooks import StopOnNonFiniteLoss, WarnOnLowDiskSpace
from .launch import add_launcher_arguments, launch_from_args
from .optimizer import build_optimizer
from .preemption import SaveOnPreemption
from .resumable_loader import build_resumable_train_loader
from .level_fit import apply_levels_from_data, log_level_fit
from .resume import ExactResume
from .slurm import apply_slurm_environment

logger = logging.getLogger("fcos_d2")


class Trainer(DefaultTrainer):
    """DefaultTrainer with COCO box evaluation, a summary.txt per evaluation, data loaders
    that use FCOSDatasetMapper and drop invalid boxes, atomic checkpoints (FCOSCheckpointer),
    exact resume (data stream and RNG states in the checkpoints), a stop on a non-finite loss,
    a checkpoint and exit status 75 on a preemption signal, a verified model_final.pth at
    the end (fcos_d2.engine.final_checkpoint), heartbeat progress reports, a warning when
    OUTPUT_DIR is short of space, SOLVER.AMP.ENABLED on the CPU (bf16 autocast where the CPU
    has native bf16, float32 elsewhere unless MODEL.FCOS.CPU_BF16 says "always";
    detectron2's AMPTrainer is CUDA-only), the backbone and head compiled with
    MODEL.FCOS.COMPILE, optionally no evaluation after the last iteration
    (``skip_final_eval``), and the steps of the registered trainer extensions that apply to
    the config (``trainer_extensions_for``)."""

    def __init__(self, cfg, skip_final_eval: bool = False):
        self.skip_final_eval = skip_final_eval  # read by build_hooks, in super().__init__
        cpu_amp = cfg.SOLVER.AMP.ENABLED and torch.device(cfg.MODEL.DEVICE).type == "cpu"
        with warnings.catch_warnings():
            if cpu_amp:  # the AMPTrainer built there is replaced below, with its CUDA scaler
                warnings.filterwarnings("ignore", message=".*GradScaler.*")
            super().__init__(cfg)
        if cpu_amp:  # bf16 where the CPU has it natively (MODEL.FCOS.CPU_BF16), else float32
            precision = cpu_autocast_dtype(torch.bfloat16, cfg.MODEL.FCOS.CPU_BF16,
                                           what="training", key="SOLVER.AMP.ENABLED")
            self._trainer = CPUAMPTrainer.replacing(self._trainer, precision)
        if comm.is_main_process():  # what the levels can see of the training boxes
            log_level_fit(cfg, self.model)
        if cfg.MODEL.FCOS.COMPILE:  # in place: DDP, checkpoints and evaluation unchanged
            parts = compile_in_place(unwrap_ddp(self.model), cfg.MODEL.DEVICE)
            logger.info(f"MODEL.FCOS.COMPILE: {' and '.join(parts)} compiled with "
                        f"torch.compile; the first iteration compiles them")
            self.register_hooks([ReportCompileTime(parts)])

    def train(self):
        """DefaultTrainer.train; an early stop (SOLVER.EARLY_STOP) ends it normally."""
        try:
            return super().train()
        except EarlyStop as stop:
            logger.info(str(stop))
            results = getattr(self, "_last_eval_results", None)
            if self.cfg.TEST.EXPECTED_RESULTS and comm.is_main_process() and results:
                verify_results(self.cfg, results)  # as DefaultTrainer.train does
            return results

    @classmethod
    def build_optimizer(cls, cfg, model):
        """detectron2's SGD, or AdamW with SOLVER.OPTIMIZER "ADAMW" (fcos_d2.engine.optimizer)."""
        return build_optimizer(cfg, model)

    @classmethod
    def build_model(cls, cfg):
        """detectron2's ``build_model`` (MODEL.META_ARCHITECTURE), after the extensions'
        ``check_config``."""
        for extension in trainer_extensions_for(cfg):
            extension.check_config(cfg)
        return super().build_model(cfg)

    def resume_or_load(self, resume=True):
        """DefaultTrainer's; then the extensions' ``after_load`` (e.g. weights of a
        member's earlier training step, read when a training starts, not when it resumes)."""
        resuming = resume and self.checkpointer.has_checkpoint()
        super().resume_or_load(resume=resume)
        for extension in trainer_extensions_for(self.cfg):
            extension.after_load(unwrap_ddp(self.model), self.cfg, resuming=resuming)

    @classmethod
    def build_evaluator(cls, cfg, dataset_name, output_folder=None, tasks=None):
        """COCOEvaluator of boxes, and of masks ("segm") too with MODEL.MASK_ON, unless
        ``tasks`` says otherwise."""
        prepare_dataset(dataset_name)
        tasks = tasks or (("bbox", "segm") if cfg.MODEL.MASK_ON else ("bbox",))
        # Without detectron2's C++ extension, COCOEvaluator must use pycocotools' COCOeval.
        return ReportingCOCOEvaluator(  # COCOEvaluator that also writes report.html
            dataset_name, tasks=tasks, use_fast_impl=compat.HAS_D2_EXTENSION,
            report=ReportOptions.from_config(cfg),
            output_dir=output_folder or os.path.join(cfg.OUTPUT_DIR, "inference", dataset_name))

    @classmethod
    def build_train_loader(cls, cfg):
        """detectron2's sampler stream, resumable exactly (fcos_d2.engine.resumable_loader), with
        FCOSDatasetMapper (16-bit images, errors naming the file), on datasets whose invalid
        boxes are dropped (fcos_d2.data.boxes)."""
        for name in cfg.DATASETS.TRAIN:
            filter_invalid_boxes_on_load(name)
        return build_resumable_train_loader(cfg, mapper=FCOSDatasetMapper(cfg, is_train=True))

    @classmethod
    def build_test_loader(cls, cfg, dataset_name):
        """FCOSDatasetMapper's test images, or the mapper the extensions' ``test_mapper``
        make of it."""
        mapper = FCOSDatasetMapper(cfg, is_train=False)
        for extension in trainer_extensions_for(cfg):
            mapper = extension.test_mapper(cfg, mapper)
        return build_detection_test_loader(cfg, dataset_name, mapper=mapper)

    @classmethod
    def test(cls, cfg, model, evaluators=None, iterations=None):
        """DefaultTrainer.test, then a summary.txt block per dataset and the verdict on
        TEST.EXPECTED_RESULTS. ``iterations``: of the weights; None: of the running training.
        The model evaluated is the one the extensions' ``test_model`` make of it, the
        summary blocks labelled with their labels."""
        model = inference_model(model, fast_inference_enabled(cfg))  # folded copy; see there
        if hasattr(model, "expected_images"):  # what INFERENCE_BACKEND "auto" weighs
            model.expected_images = test_images_per_worker(cfg)
        labels = []
        for extension in trainer_extensions_for(cfg):
            model, label = extension.test_model(cfg, model)
            labels += [label] if label else []
        label = ", ".join(labels)
        results = super().test(cfg, model, evaluators)
        if comm.is_main_process():
            if iterations is None:
                iterations = iterations_trained(cfg.SOLVER.MAX_ITER)
            append_summaries(cfg.OUTPUT_DIR, cfg.DATASETS.TEST, results, iterations, label)
            if cfg.TEST.EXPECTED_RESULTS:
                logger.info(expected_results_verdict(cfg.TEST.EXPECTED_RESULTS, results))
        return results

    @classmethod
    def test_with_TTA(cls, cfg, model, iterations=None):
        """Evaluation with test-time augmentation (TEST.AUG): COCOEvaluator's files go to
        OUTPUT_DIR/inference_TTA/<dataset>, the summary.txt blocks say [TTA], and every
        result key gets "_TTA", as in detectron2's tools/train_net.py. A mask model's masks
        are voted over the copies (fcos_d2/modeling/test_time_augmentation.py) and scored
        as "segm" too."""
        logger.info("Running inference with test-time augmentation ...")
        evaluators = [cls.build_evaluator(cfg, name, output_folder=os.path.join(
            cfg.OUTPUT_DIR, "inference_TTA", name)) for name in cfg.DATASETS.TEST]
        model = inference_model(model, fast_inference_enabled(cfg))
        results = super().test(cfg, FCOSWithTTA(cfg, model), evaluators)
        if comm.is_main_process():
            append_summaries(cfg.OUTPUT_DIR, cfg.DATASETS.TEST, results, iterations, label="TTA")
        return OrderedDict((key + "_TTA", value) for key, value in results.items())

    def build_hooks(self):
        # DefaultTrainer.__init__ made self.checkpointer just before; the checkpoint hook
        # must get this one (atomic saves; see fcos_d2/checkpoint/checkpointer.py).
        self.checkpointer = FCOSCheckpointer.from_config(
            self.cfg, self.checkpointer.model, self.cfg.OUTPUT_DIR, reinit_mismatched=True,
            **self.checkpointer.checkpointables)
        # First: the states they save must be taken before the checkpointer's after_step.
        exact_resume = ExactResume(self.cfg.SOLVER.CHECKPOINT_PERIOD)
        hook_list = [exact_resume, StopOnNonFiniteLoss(), ReportProgress(),
                     WarnOnLowDiskSpace(self.checkpointer), *super().build_hooks()]
        # after the LR scheduler and the checkpointer (rank 0), before the evaluation
        evaluation = next(i for i, h in enumerate(hook_list) if isinstance(h, hooks.EvalHook))
        hook_list.insert(evaluation, SaveOnPreemption(self.checkpointer, exact_resume))
        # also before the evaluation: a run that did not save its final model ends there
        hook_list.insert(evaluation + 1, ProveFinalCheckpoint(self.checkpointer))
        hook_list.append(ScheduleOnResume(schedule_record(self.cfg)))  # checked on --resume
        if self.cfg.TEST.EVAL_PERIOD > 0 or self.cfg.SOLVER.EARLY_STOP.PATIENCE:  # model_best,
            # early stop: after the evaluation (appended: after the EvalHook)
            hook_list.append(KeepBestCheckpoint.from_config(self.cfg, self.checkpointer))
        if self.skip_final_eval:  # the same evaluation function (EvalHook._func in v0.6 and
            # main), in a hook that skips the evaluation after the last iteration
            eval_hook = next(h for h in hook_list if isinstance(h, hooks.EvalHook))
            hook_list[hook_list.index(eval_hook)] = _PeriodicEvalHook(
                self.cfg.TEST.EVAL_PERIOD, eval_hook._func)
        for extension in trainer_extensions_for(self.cfg):
            hook_list.extend(extension.hooks(self.cfg))
        return hook_list


class _PeriodicEvalHook(hooks.EvalHook):
    """EvalHook without the evaluation after the last iteration (--skip-test)."""

    def after_train(self):
        pass


def setup(args):
    """The frozen config of the command line ``args``: the config file, then the overrides;
    MODEL.DEVICE cpu where CUDA is missing; the ``--register-coco`` datasets registered and
    checked against MODEL.FCOS.NUM_CLASSES; the extensions' ``check_config`` and
    ``adjust_config``; detectron2's ``default_setup`` (OUTPUT_DIR, logs, seed)."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    fallback = ""
    if cfg.MODEL.DEVICE.startswith("cuda") and not torch.cuda.is_available():
        fallback = f"CUDA is not available: MODEL.DEVICE {cfg.MODEL.DEVICE} -> cpu"
        if cfg.SOLVER.AMP.ENABLED:
            fallback += " (SOLVER.AMP.ENABLED: bf16 autocast on the CPU)"
        cfg.MODEL.DEVICE = "cpu"
    for name, json_file, image_root in args.register_coco:
        register_coco_dataset(name, json_file, image_root)
    schedule = None if args.eval_only else apply_epoch_schedule(  # SOLVER.EPOCHS & co.
        cfg, config_layers(args.config_file, args.opts), comm.get_world_size())
    check_num_classes([*cfg.DATASETS.TRAIN, *cfg.DATASETS.TEST], cfg.MODEL.FCOS.NUM_CLASSES)
    levels = apply_levels_from_data(cfg)  # MODEL.FCOS.LEVELS_FROM_DATA; also for --eval-only
    for extension in trainer_extensions_for(cfg):  # members' checks, then changes
        extension.check_config(cfg)
        extension.adjust_config(cfg)
    cfg.freeze()
    default_setup(cfg, args)
    setup_logger(cfg.OUTPUT_DIR, distributed_rank=comm.get_rank(), name="fcos_d2")
    if fallback:
        logger.warning(fallback)
    if schedule is not None:
        logger.info(schedule.describe())
    if levels:
        logger.info(levels)
    return cfg


def test_images_per_worker(cfg) -> int:
    """The images of DATASETS.TEST each worker evaluates (at least 1)."""
    total = sum(len(DatasetCatalog.get(name)) for name in cfg.DATASETS.TEST)
    return max(1, total // comm.get_world_size())


def evaluate_weights(cfg, resume: bool = False):
    """``--eval-only``: (results, model) of MODEL.WEIGHTS (with ``resume``, of OUTPUT_DIR's
    last checkpoint if any), also with test-time augmentation under TEST.AUG.ENABLED,
    verified against TEST.EXPECTED_RESULTS."""
    model = Trainer.build_model(cfg)
    checkpoint = FCOSCheckpointer.from_config(cfg, model, cfg.OUTPUT_DIR).resume_or_load(
        cfg.MODEL.WEIGHTS, resume=resume)
    iteration = checkpoint.get("iteration")  # the 0-based iteration the weights are from
    iterations = None if iteration is None else iteration + 1
    results = Trainer.test(cfg, model, iterations=iterations)
    if cfg.TEST.AUG.ENABLED:
        results.update(Trainer.test_with_TTA(cfg, model, iterations=iterations))
    if comm.is_main_process():
        verify_results(cfg, results)
    return results, model


def main(args):
    """One worker's training (or, with ``--eval-only``, evaluation) of the command line
    ``args``; then, with ``--vis-val N``, pictures of N predictions. Returns the results."""
    cfg = setup(args)
    if args.eval_only:
        results, model = evaluate_weights(cfg, resume=args.resume)
    else:
        trainer = Trainer(cfg, skip_final_eval=args.skip_test)
        trainer.resume_or_load(resume=args.resume)
        results, model = trainer.train(), trainer.model
    if args.vis_val and comm.is_main_process():
        model = inference_model(unwrap_ddp(model), fast_inference_enabled(cfg))
        name = cfg.DATASETS.TEST[0]
        folder = os.path.join(cfg.OUTPUT_DIR, "inference", name, "predictions")
        save_loader_predictions(model, Trainer.build_test_loader(cfg, name),
                                MetadataCatalog.get(name), folder, max_images=args.vis_val)
    return results


def argument_parser():
    """detectron2's arguments, the launcher's (fcos_d2.engine.launch) and fcos-d2's own."""
    parser = add_launcher_arguments(default_argument_parser())
    parser.add_argument("--skip-test", action="store_true",
                        help="do not evaluate after the last iteration (periodic evaluations stay)")
    parser.add_argument("--register-coco", nargs=3, action="append", default=[],
                        metavar=("NAME", "ANNOTATIONS.json", "IMAGE_DIR"),
                        help="register a COCO-format dataset under NAME (repeatable)")
    parser.add_argument("--vis-val", type=int, default=0, metavar="N",
                        help="save pictures and JSON of predictions on the first N images of "
                             "DATASETS.TEST[0] to OUTPUT_DIR/inference/<dataset>/predictions")
    return parser


def run_from_command_line(argv: Optional[List[str]] = None) -> None:
    """``train_net.py`` and ``fcos-d2-train``: parses ``argv`` (default: the command's own
    arguments; under SLURM's srun, its environment fills what the flags leave out), then
    launches ``main`` on every worker."""
    parser = argument_parser()
    args = apply_slurm_environment(parser, sys.argv[1:] if argv is None else argv, os.environ)
    print("Command Line Args:", args)
    launch_from_args(main, args)
