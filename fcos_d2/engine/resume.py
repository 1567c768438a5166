"""``ExactResume``: the part of a training's state that detectron2's checkpoints leave out.

A detectron2 checkpoint holds the weights, the iteration, the LR scheduler and (with
``fcos_d2.compat`` on v0.6) the optimizer. A resumed run still differs from an
uninterrupted one because the data stream starts again and the random generators are
seeded anew. This hook adds to every checkpoint, for each of the W workers (ranks): the
state of its training data loader (``ResumableTrainLoader.state_dict``), of its global
random generators (python ``random``, ``numpy``, ``torch`` CPU and CUDA) and of the
model's moving-average loss normalizers (``MODEL.FCOS.LOSS_NORMALIZER "ema"``, the
small-data recipe's, which is not a tensor of the state dict). Everything is
made of tensors, ints, floats, strings, lists and dicts, so checkpoints still load with
``torch.load(weights_only=True)``.

The states are gathered from all workers after each iteration at which the periodic
checkpointer saves (only rank 0 writes the file), and ``load_state_dict`` gives each rank
its own. Evaluation runs after the checkpointer and draws random numbers (a data loader
draws its base seed); so that a resumed run, which skips that evaluation, continues the
same random streams, the generators are set back to their saved states before the next
iteration.
"""
import logging
import random
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from detectron2.engine import HookBase
from detectron2.utils import comm

from ..modeling.losses import load_loss_normalizer_states, loss_normalizer_states
from ..parallel import unwrap_ddp

__all__ = ["ExactResume", "get_rng_states", "set_rng_states"]

logger = logging.getLogger(__name__)


def get_rng_states() -> Dict[str, Any]:
    """The global random generators' states, as tensors, ints, floats and lists."""
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }


def set_rng_states(states: Dict[str, Any]) -> None:
    """Sets the global random generators to ``states`` (from ``get_rng_states``)."""
    torch.set_rng_state(states["torch"])
    if states["cuda"] and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])
    numpy_state = states["numpy"]
    np.random.set_state(("MT19937", numpy_state["keys"].numpy().astype(np.uint32),
                         numpy_state["pos"], numpy_state["has_gauss"],
                         numpy_state["cached_gaussian"]))
    python_state = states["python"]
    random.setstate((python_state["version"], tuple(python_state["internal"]),
                     python_state["gauss_next"]))


class ExactResume(HookBase):
    """Saves each worker's data-stream position and RNG states with the checkpoints, and
    restores them on ``--resume``. Register it before the ``PeriodicCheckpointer``, in
    every worker; ``checkpoint_period`` is the checkpointer's (SOLVER.CHECKPOINT_PERIOD)."""

    def __init__(self, checkpoint_period: int):
        self._period = checkpoint_period
        self._saved: Optional[Dict[str, Any]] = None  # {"iteration", "workers": [W states]}
        self._rng_to_restore: Optional[Dict[str, Any]] = None  # before the next iteration
        self._loaded = False

    def before_train(self):
        if self.trainer.start_iter > 0 and not self._loaded:
            logger.warning("The checkpoint resumed from has no data-stream and RNG states "
                           "(written by an older fcos-d2 or another trainer): the data stream "
                           "starts again, and the resumed training will not repeat an "
                           "uninterrupted one.")

    def before_step(self):
        if self._rng_to_restore is not None:
            set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None

    def after_step(self):
        iteration = self.trainer.iter
        if (iteration + 1) % self._period == 0 or iteration >= self.trainer.max_iter - 1:
            self.capture()

    def capture(self) -> None:
        """Gathers every worker's states at this iteration, for a checkpoint of it (the
        periodic ones, or SaveOnPreemption's); all workers call it."""
        state = self._local_state()
        workers = comm.all_gather(state) if comm.get_world_size() > 1 else [state]
        self._saved = {"iteration": self.trainer.iter, "workers": workers}
        self._rng_to_restore = state["rng"]

    def state_dict(self) -> Dict[str, Any]:
        if self._saved is not None and self._saved["iteration"] == self.trainer.iter:
            return self._saved
        if comm.get_world_size() == 1:  # a save off the checkpointer's schedule
            return {"iteration": self.trainer.iter, "workers": [self._local_state()]}
        return {}  # other workers' states were not gathered at this iteration

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._loaded = True
        workers: List[Dict[str, Any]] = state["workers"]
        if len(workers) != comm.get_world_size():
            logger.warning(f"The checkpoint was written by {len(workers)} workers and this "
                           f"job has {comm.get_world_size()}: the data stream starts again "
                           "and the resumed training will not repeat an uninterrupted one.")
            return
        mine = workers[comm.get_rank()]
        loader = self.trainer.data_loader
        if mine["data"] is not None and hasattr(loader, "load_state_dict"):
            loader.load_state_dict(mine["data"])
        else:
            logger.warning(f"The training data loader ({type(loader).__name__}) cannot be "
                           "resumed: its stream starts again.")
        set_rng_states(mine["rng"])
        self._rng_to_restore = mine["rng"]
        self._load_loss_normalizers(mine.get("loss_normalizers", {}))

    def _load_loss_normalizers(self, states: Dict[str, dict]) -> None:
        missing, unexpected = load_loss_normalizer_states(unwrap_ddp(self.trainer.model), states)
        if missing:
            logger.warning(f"The checkpoint has no state of the EMA loss normalizer of "
                           f"{missing} (written by an older fcos-d2): it starts again from "
                           f"MODEL.FCOS.LOSS_NORMALIZER_EMA_INIT, and the resumed training "
                           f"will not repeat an uninterrupted one.")
        if unexpected:
            logger.warning(f"The checkpoint holds EMA loss normalizer states of {unexpected}, "
                           f"which this model has none of (MODEL.FCOS.LOSS_NORMALIZER "
                           f"changed?): they are ignored.")

    def _local_state(self) -> Dict[str, Any]:
        loader = self.trainer.data_loader
        data = loader.state_dict() if hasattr(loader, "state_dict") else None
        return {"data": data, "rng": get_rng_states(),
                "loss_normalizers": loss_normalizer_states(unwrap_ddp(self.trainer.model))}
