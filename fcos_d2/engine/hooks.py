"""Training hooks for faults that detectron2 handles late or not at all."""
import logging
import math
import os
from typing import Dict, List

import torch
from detectron2.engine import HookBase
from detectron2.utils import comm

from ..checkpoint.disk_space import low_space_warning, tensor_bytes

__all__ = ["StopOnNonFiniteLoss", "WarnOnLowDiskSpace"]

logger = logging.getLogger(__name__)


class StopOnNonFiniteLoss(HookBase):
    """Stops training when a loss is NaN or infinite, before it reaches the weights.

    The check runs on the losses the model returns, in every worker (the workers exchange
    their losses, so they all stop at the same iteration), before the backward pass: the
    failed step changes no weight and, as it never finishes, the periodic checkpointer
    writes nothing after it. detectron2 checks later, after the backward pass and on rank 0
    only: the other workers carry on and fail only when a collective finds rank 0 gone.
    """

    def before_train(self):
        self._handle = self.trainer.model.register_forward_hook(self._check)

    def after_train(self):
        self._handle.remove()

    def _check(self, module: torch.nn.Module, inputs, losses) -> None:
        if not module.training or not isinstance(losses, dict):
            return  # inference (e.g. an evaluation during training)
        values = torch.stack([v.detach().float().reshape(()) for v in losses.values()])
        local = dict(zip(losses.keys(), values.tolist()))
        workers = comm.all_gather(local) if comm.get_world_size() > 1 else [local]
        if all(math.isfinite(v) for worker in workers for v in worker.values()):
            return
        raise FloatingPointError(self._message(workers))

    def _message(self, workers: List[Dict[str, float]]) -> str:
        def listed(losses: Dict[str, float]) -> str:
            return ", ".join(f"{name}={value:.6g}" for name, value in losses.items())

        if len(workers) == 1:
            values = listed(workers[0])
        else:
            values = "; ".join(f"worker {rank}: {listed(losses)}"
                               for rank, losses in enumerate(workers)
                               if not all(math.isfinite(v) for v in losses.values()))
        checkpointer = getattr(self.trainer, "checkpointer", None)
        last = (checkpointer.get_checkpoint_file()
                if checkpointer is not None and checkpointer.has_checkpoint() else None)
        saved = (f"the last checkpoint, {last}, is intact: resume from it with --resume"
                 if last else "no checkpoint had been written yet")
        return (f"training stopped at iteration {self.trainer.iter}: the loss is not finite "
                f"({values}). This step changed no weight and wrote no checkpoint; {saved} "
                "once the cause is fixed (e.g. a lower SOLVER.BASE_LR, a longer "
                "SOLVER.WARMUP_ITERS, SOLVER.CLIP_GRADIENTS.ENABLED True, or a bad box in "
                "the data).")


class WarnOnLowDiskSpace(HookBase):
    """Before training, on rank 0: warns when the checkpointer's folder has room for fewer
    than ``checkpoints`` checkpoints. A checkpoint is estimated as the model's tensors
    twice (the weights and one optimizer buffer per weight, as SGD with momentum keeps).
    """

    def __init__(self, checkpointer, checkpoints: int = 3):
        self._checkpointer = checkpointer
        self._checkpoints = checkpoints

    def before_train(self):
        folder = self._checkpointer.save_dir
        if not comm.is_main_process() or not folder or not os.path.isdir(folder):
            return
        size = 2 * tensor_bytes(self._checkpointer.model.state_dict())
        warning = low_space_warning(folder, size, self._checkpoints)
        if warning:
            logger.warning(warning)
