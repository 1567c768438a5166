"""The best checkpoint and early stopping, driven by the periodic evaluations.

``ImprovementTracker`` is the pure rule: which evaluation is the best so far, and when the
metric has stopped improving. ``KeepBestCheckpoint`` is the hook that applies it after each
evaluation of a training: it writes ``OUTPUT_DIR/model_best.pth`` (an ordinary checkpoint,
holding the iteration it is from), notes the best in summary.txt and report.html, and stops
the training (``EarlyStop``) after ``patience`` evaluations without improvement.

Why not detectron2's ``BestCheckpointer`` (v0.6): its save re-tags ``last_checkpoint`` to
model_best.pth, so ``--resume`` would go back to the best iteration instead of the last;
it forgets the best on resume, so the first evaluation after a resume overwrites a better
model_best.pth; and it cannot stop a training. This hook keeps its rule (a strictly better
metric, NaN never best) and its file name.

Early stopping respects the LR schedule's last step (``last_step``): evaluations of weights
trained ``<= last_step`` iterations update the best but never count towards the patience,
so a run stops at the earliest after its last LR decay has shown its gain. Bringing the
step forward instead would change the schedule mid-run, in a way that a resume and the
schedule check on resume (fcos_d2.engine.schedule) could not reproduce.
"""
import logging
import math
import os
from typing import Any, Dict, NamedTuple, Optional

from detectron2.engine import HookBase
from detectron2.utils import comm

from ..evaluation import append_summary_note
from ..evaluation.report.page import add_page_note

__all__ = ["EarlyStop", "ImprovementTracker", "KeepBestCheckpoint", "best_metric_name"]

logger = logging.getLogger(__name__)

BEST_FILE_PREFIX = "model_best"


class EarlyStop(BaseException):
    """Raised by KeepBestCheckpoint to end the training loop early (a BaseException, as
    SystemExit: not an error that detectron2's loop logs with a traceback)."""


class Verdict(NamedTuple):
    is_best: bool  # strictly better than every earlier evaluation
    stop: bool  # the patience is used up


class ImprovementTracker:
    """Follows a metric over evaluations.

    Args:
        mode: "max" (higher is better) or "min".
        patience: stop after this many counted evaluations in a row that do not beat the
            reference by more than ``min_delta``; 0 never stops.
        min_delta: the improvement that resets the patience; the reference is the metric
            of the last evaluation that did (the first evaluation sets it).
    """

    def __init__(self, mode: str = "max", patience: int = 0, min_delta: float = 0.0):
        if mode not in ("max", "min"):
            raise ValueError(f"TEST.BEST_CHECKPOINT.MODE {mode!r}: use 'max' or 'min'")
        if patience < 0 or min_delta < 0:
            raise ValueError(f"SOLVER.EARLY_STOP: PATIENCE {patience} and MIN_DELTA "
                             f"{min_delta} must not be negative")
        self.sign = 1.0 if mode == "max" else -1.0
        self.patience, self.min_delta = patience, min_delta
        self.best: Optional[float] = None
        self.best_iterations: Optional[int] = None
        self.reference: Optional[float] = None
        self.stale = 0  # counted evaluations since the reference

    def update(self, value: float, iterations: int, counts: bool = True) -> Verdict:
        """Takes one evaluation.

        Args:
            value: the metric; NaN or infinite is never best nor an improvement.
            iterations: iterations trained by the evaluated weights.
            counts: whether this evaluation may count towards the patience.
        """
        finite = math.isfinite(value)
        is_best = finite and (self.best is None or self.sign * (value - self.best) > 0)
        if is_best:
            self.best, self.best_iterations = value, iterations
        if finite and (self.reference is None
                       or self.sign * (value - self.reference) > self.min_delta):
            self.reference, self.stale = value, 0
        elif counts:
            self.stale += 1
        return Verdict(is_best, self.should_stop())

    def should_stop(self) -> bool:
        return self.patience > 0 and self.stale >= self.patience

    def state_dict(self) -> Dict[str, Any]:
        return {"best": self.best, "best_iterations": self.best_iterations,
                "reference": self.reference, "stale": self.stale}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.best, self.best_iterations = state["best"], state["best_iterations"]
        self.reference, self.stale = state["reference"], state["stale"]


def best_metric_name(metric: str, mask_on: bool, test_datasets) -> str:
    """TEST.BEST_CHECKPOINT.METRIC, or its default: "bbox/AP" ("segm/AP" for mask models),
    under the first test dataset's name when there are several (detectron2's flattening)."""
    if metric:
        return metric
    name = "segm/AP" if mask_on else "bbox/AP"
    return f"{test_datasets[0]}/{name}" if len(test_datasets) > 1 else name


class KeepBestCheckpoint(HookBase):
    """After each evaluation: model_best.pth when the metric is the best so far, and an
    EarlyStop when the tracker's patience is used up. Register it after the EvalHook, in
    every worker (the decision to stop is rank 0's, shared with all)."""

    def __init__(self, checkpointer, *, eval_period: int, metric: str,
                 tracker: ImprovementTracker, last_step: int = 0, save_best: bool = True,
                 output_dir: str = "", dataset_name: str = ""):
        """``last_step``: the last LR step (iterations); ``save_best``: write model_best.pth;
        ``output_dir``, ``dataset_name``: where summary.txt and report.html are noted."""
        if tracker.patience and eval_period <= 0:
            raise ValueError(f"SOLVER.EARLY_STOP.PATIENCE {tracker.patience} needs periodic "
                             f"evaluation: set TEST.EVAL_PERIOD (or TEST.EVAL_PERIOD_EPOCHS)")
        self.checkpointer, self.eval_period, self.metric = checkpointer, eval_period, metric
        self.save_best = save_best
        self.tracker, self.last_step = tracker, last_step
        self.output_dir, self.dataset_name = output_dir, dataset_name
        self._seen: Optional[int] = None  # storage iteration of the last metric taken

    @classmethod
    def from_config(cls, cfg, checkpointer) -> "KeepBestCheckpoint":
        tracker = ImprovementTracker(cfg.TEST.BEST_CHECKPOINT.MODE,
                                     cfg.SOLVER.EARLY_STOP.PATIENCE,
                                     cfg.SOLVER.EARLY_STOP.MIN_DELTA)
        steps = [s for s in cfg.SOLVER.STEPS if s < cfg.SOLVER.MAX_ITER]
        return cls(checkpointer, eval_period=cfg.TEST.EVAL_PERIOD, tracker=tracker,
                   metric=best_metric_name(cfg.TEST.BEST_CHECKPOINT.METRIC, cfg.MODEL.MASK_ON,
                                           cfg.DATASETS.TEST),
                   last_step=max(steps, default=0), output_dir=cfg.OUTPUT_DIR,
                   save_best=cfg.TEST.BEST_CHECKPOINT.ENABLED,
                   dataset_name=cfg.DATASETS.TEST[0] if cfg.DATASETS.TEST else "")

    def before_train(self):
        if self.tracker.should_stop():  # resumed after an early stop: nothing left to do
            raise EarlyStop(f"early stop: already stopped ({self._why()})")

    def after_step(self):
        next_iter = self.trainer.iter + 1  # the EvalHook's periodic condition
        if self.eval_period > 0 and next_iter % self.eval_period == 0 \
                and next_iter != self.trainer.max_iter:
            self._after_evaluation()

    def after_train(self):
        if self.trainer.iter + 1 >= self.trainer.max_iter:  # the final evaluation's condition
            self._after_evaluation()

    def _after_evaluation(self) -> None:
        stop = self._take_metric() if comm.is_main_process() else False
        if comm.get_world_size() > 1:
            stop = comm.all_gather(stop)[0]
        if stop and self.trainer.iter + 1 < self.trainer.max_iter:
            message = f"early stop after iteration {self.trainer.iter + 1}: {self._why()}"
            if comm.is_main_process():
                self.checkpointer.save("model_final", iteration=self.trainer.iter)
                if self.output_dir and self.dataset_name:
                    append_summary_note(self.output_dir, self.dataset_name, message)
            raise EarlyStop(message)

    def _take_metric(self) -> bool:
        """Rank 0: updates the tracker with the newest evaluation; returns whether to stop."""
        latest = self.trainer.storage.latest().get(self.metric)
        if latest is None:
            logger.warning(f"TEST.BEST_CHECKPOINT.METRIC: no metric {self.metric!r} in the "
                           f"evaluation results; no model_best.pth, no early stop")
            return False
        value, storage_iter = latest
        if storage_iter == self._seen:  # no new evaluation (e.g. --skip-test at the end)
            return False
        self._seen = storage_iter
        iterations = min(storage_iter + 1, self.trainer.max_iter)
        verdict = self.tracker.update(value, iterations, counts=iterations > self.last_step)
        if verdict.is_best and self.save_best:
            self._save_best(iterations)
        return verdict.stop

    def _save_best(self, iterations: int) -> None:
        checkpointer = self.checkpointer
        last = checkpointer.get_checkpoint_file() if checkpointer.has_checkpoint() else ""
        checkpointer.save(BEST_FILE_PREFIX, iteration=iterations - 1)  # 0-based, as all
        tag = os.path.join(checkpointer.save_dir, "last_checkpoint")
        if last:  # saving re-tagged last_checkpoint: --resume must still go to the last one
            checkpointer.tag_last_checkpoint(os.path.basename(last))
        elif os.path.isfile(tag):  # no checkpoint to resume from yet
            os.remove(tag)
        note = (f"best {self.metric} {self.tracker.best:.2f} after {iterations} "
                f"iterations trained ({BEST_FILE_PREFIX}.pth)")
        logger.info(f"{note}, saved")
        if self.output_dir and self.dataset_name:
            append_summary_note(self.output_dir, self.dataset_name, note)
            page = os.path.join(self.output_dir, "inference", self.dataset_name, "report.html")
            if os.path.isfile(page):
                add_page_note(page, note)

    def _why(self) -> str:
        t = self.tracker
        return (f"{t.stale} evaluations without an improvement of {self.metric} by more than "
                f"{t.min_delta} (SOLVER.EARLY_STOP.PATIENCE {t.patience}); best "
                f"{t.best} after {t.best_iterations} iterations ({BEST_FILE_PREFIX}.pth)")

    def state_dict(self) -> Dict[str, Any]:
        return {"metric": self.metric, **self.tracker.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state.get("metric") != self.metric:
            logger.warning(f"The checkpoint followed {state.get('metric')!r}, this run "
                           f"{self.metric!r}: the best and the patience start anew")
            return
        self.tracker.load_state_dict(state)
