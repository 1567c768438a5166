"""A finished training proves that it saved: ``ProveFinalCheckpoint``, ``checkpoint_problem``
and ``UnverifiedCheckpointError``.

A job that exits 0 is trusted to have left its model (a SLURM requeue script, a pipeline),
so when training reaches SOLVER.MAX_ITER, OUTPUT_DIR/model_final.pth must exist, load with
the data-only loader (``fcos_d2.checkpoint.safe_load``) and hold the last iteration;
otherwise the run ends with ``UnverifiedCheckpointError`` naming the file and the folder.
SaveOnPreemption checks its checkpoint the same way (``checkpoint_problem``) before it
exits with status 75.

Why a resumed run could end without model_final.pth: detectron2's PeriodicCheckpointer,
after the last iteration (MAX_ITER - 1), saves ``model_{MAX_ITER-1}`` when
CHECKPOINT_PERIOD divides MAX_ITER, points ``last_checkpoint`` at it, and only then saves
``model_final``. A run killed between the two saves leaves ``last_checkpoint`` naming a
checkpoint of the last iteration; ``--resume`` then starts at MAX_ITER, trains nothing, and
the checkpointer, which saves after iterations only, saves nothing. Before such a run
trains (nothing), this hook completes it: the checkpoint it resumed from, a file of the
last iteration, is copied to model_final.pth (atomically; the same bytes an uninterrupted
run writes there) and ``last_checkpoint`` is pointed at it.
"""
import logging
import os
import shutil
from typing import Optional

from detectron2.engine import HookBase
from detectron2.utils import comm

from ..checkpoint.atomic import atomic_write
from ..checkpoint.safe_load import CheckpointReadError, UnsafeCheckpointError, load_torch_file

__all__ = ["FINAL_CHECKPOINT", "ProveFinalCheckpoint", "UnverifiedCheckpointError",
           "checkpoint_problem", "verify_final_checkpoint"]

logger = logging.getLogger(__name__)

FINAL_CHECKPOINT = "model_final.pth"  # PeriodicCheckpointer's f"{file_prefix}_final"


class UnverifiedCheckpointError(RuntimeError):
    """A checkpoint a training must leave is missing, unreadable or of another iteration."""


def checkpoint_problem(path: str, iteration: int) -> Optional[str]:
    """What is wrong with the checkpoint ``path`` that should hold 0-based ``iteration``:
    None when it exists, loads as data (weights_only) with a "model", and holds it."""
    if not os.path.isfile(path):
        return f"{path} does not exist"
    try:
        data = load_torch_file(path)
    except (CheckpointReadError, UnsafeCheckpointError) as error:
        return f"{path} does not load ({error})"
    if not isinstance(data, dict) or "model" not in data:
        return f"{path} holds no model weights"
    stored = data.get("iteration")
    if stored != iteration:
        return f"{path} holds iteration {stored}, not the last one, {iteration}"
    return None


def verify_final_checkpoint(output_dir: str, iteration: int) -> None:
    """Raises UnverifiedCheckpointError unless OUTPUT_DIR/model_final.pth holds the weights
    of 0-based ``iteration``, the last one trained."""
    problem = checkpoint_problem(os.path.join(output_dir, FINAL_CHECKPOINT), iteration)
    if problem is not None:
        raise UnverifiedCheckpointError(
            f"training reached its last iteration ({iteration}) but the final checkpoint is "
            f"not in place: {problem}. Output folder: {output_dir}. Run the same command "
            f"with --resume to write it from the newest checkpoint there (nothing is "
            f"retrained), and check the disk that holds the folder.")
    logger.info(f"Final checkpoint verified: {os.path.join(output_dir, FINAL_CHECKPOINT)} "
                f"(iteration {iteration})")


class ProveFinalCheckpoint(HookBase):
    """On the main process: completes a run resumed at its end (see the module docstring)
    before training, and verifies model_final.pth after a training that reached MAX_ITER.

    Args:
        checkpointer: the trainer's checkpointer (its save_dir is OUTPUT_DIR).
    """

    def __init__(self, checkpointer):
        self._checkpointer = checkpointer

    def _active(self) -> bool:
        return bool(self._checkpointer.save_dir) and comm.is_main_process()

    def _last_iteration(self) -> int:
        # a resume from beyond MAX_ITER (MAX_ITER lowered since) ends where it started
        return max(self.trainer.max_iter, self.trainer.start_iter) - 1

    def before_train(self):
        if self._active() and self.trainer.start_iter >= self.trainer.max_iter:
            self._complete_final_checkpoint(self._last_iteration())

    def after_train(self):
        # trainer.iter reaches max_iter only when the loop ended without an exception
        if self._active() and self.trainer.iter >= self.trainer.max_iter:
            verify_final_checkpoint(self._checkpointer.save_dir, self._last_iteration())

    def _complete_final_checkpoint(self, iteration: int) -> None:
        folder = self._checkpointer.save_dir
        final = os.path.join(folder, FINAL_CHECKPOINT)
        if checkpoint_problem(final, iteration) is None:
            return
        source = self._checkpoint_of(iteration)
        if source is None:  # after_train names the missing file
            logger.warning(f"Resumed at the end of training, and no checkpoint of iteration "
                           f"{iteration} in {folder} to write {final} from.")
            return
        with open(source, "rb") as f:
            atomic_write(final, lambda out: shutil.copyfileobj(f, out))
        self._checkpointer.tag_last_checkpoint(FINAL_CHECKPOINT)
        logger.warning(f"Resumed at the end of training without a final checkpoint (the "
                       f"previous run was stopped between its last two saves): {final} "
                       f"written from {source}, of the same iteration ({iteration}).")

    def _checkpoint_of(self, iteration: int) -> Optional[str]:
        """The file last_checkpoint names if it holds ``iteration``, else another one."""
        named = (self._checkpointer.get_checkpoint_file()
                 if self._checkpointer.has_checkpoint() else None)
        others = sorted(self._checkpointer.get_all_checkpoint_files(), reverse=True)
        for path in ([named] if named else []) + others:
            if os.path.basename(path) != FINAL_CHECKPOINT and \
                    checkpoint_problem(path, iteration) is None:
                return path
        return None
