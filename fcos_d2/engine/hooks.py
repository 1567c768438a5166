"""Training hooks for faults that detectron2 handles late or not at all."""
import logging
import math
from typing import Dict, List

import torch
from detectron2.engine import HookBase
from detectron2.utils import comm

__all__ = ["StopOnNonFiniteLoss"]

logger = logging.getLogger(__name__)


class StopOnNonFiniteLoss(HookBase):
    """Stops training when a loss is NaN or infinite, before it reaches the weights.

    The check runs on the losses the model returns, in every worker (the workers exchange
    their losses, so they all stop at the same iteration), before the backward pass: the
    failed step changes no weight and, as it never finishes, the periodic checkpointer
    writes nothing after it. detectron2 checks later (after the backward pass, on rank 0
    only, so the other workers wait for it until their collective timeout).
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
        bad = [rank for rank, worker in enumerate(workers)
               if not all(math.isfinite(v) for v in worker.values())]
        lines = [f"worker {rank}: " + ", ".join(f"{k}={v:.6g}" for k, v in workers[rank].items())
                 for rank in bad] if len(workers) > 1 else [
            ", ".join(f"{k}={v:.6g}" for k, v in workers[0].items())]
        checkpointer = getattr(self.trainer, "checkpointer", None)
        last = (checkpointer.get_checkpoint_file() if checkpointer is not None
                and checkpointer.has_checkpoint() else None)
        saved = (f"the last checkpoint, {last}, is intact: resume from it with --resume"
                 if last else "no checkpoint had been written yet")
        return (f"training stopped at iteration {self.trainer.iter}: the loss is not finite ("
                + "; ".join(lines) + "). This step changed no weight and wrote no checkpoint; "
                + saved + " once the cause is fixed (e.g. a lower SOLVER.BASE_LR, a longer "
                "SOLVER.WARMUP_ITERS, SOLVER.CLIP_GRADIENTS.ENABLED True, or a bad box in "
                "the data).")
