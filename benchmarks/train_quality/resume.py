"""A benchmark run that survives being killed: where a training is, saved now and then in
its run folder, and taken up again when the same run starts there again.

A run of the recipe's schedule takes hours on a CPU; a session or a job that ends kills
it. ``RunCheckpoint`` writes ``<run folder>/resume.pth`` every ``period_seconds`` of training
(after the iteration's other hooks): the weights, the optimizer and LR scheduler, the
models' loss normalizers, the losses kept so far, the global random generators, the
training seconds so far and the run's config. ``resume_state`` reads it back for the same
config (another config is refused, naming the file). The protocol then rebuilds the run as
it started, draws the batches already trained on again from the same loader (no training:
mapping a batch costs milliseconds) and checks that the generators then equal the saved
ones, so that the rest of the run repeats an uninterrupted one; the record says where it
resumed and whether that check held."""
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from detectron2.engine import HookBase

RESUME_FILE = "resume.pth"
CHECKPOINT_SECONDS = 600.0  # training seconds between two saves


def _equal_states(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    """Whether two ``get_rng_states`` are the same (torch's, numpy's and python's)."""
    import torch

    return (torch.equal(a["torch"], b["torch"])
            and torch.equal(a["numpy"]["keys"], b["numpy"]["keys"])
            and a["numpy"]["pos"] == b["numpy"]["pos"]
            and list(a["python"]["internal"]) == list(b["python"]["internal"]))


class RunCheckpoint(HookBase):
    """Saves the run's state to `path` every `period_seconds` of training, after the
    iteration's other hooks (register it last); none after the last iteration."""

    def __init__(self, path: Path, *, scheduler, recorder, config: str,
                 seconds_before: float = 0.0, resumed: Sequence[dict] = (),
                 period_seconds: float = CHECKPOINT_SECONDS):
        self.path, self.scheduler, self.recorder = Path(path), scheduler, recorder
        self.config, self.period = config, period_seconds
        self.seconds_before = seconds_before  # training seconds of earlier attempts
        self.resumed = list(resumed)  # restore's notes of every resume so far
        self._started = self._saved = time.perf_counter()

    def after_step(self):
        last = self.trainer.iter >= self.trainer.max_iter - 1
        if not last and time.perf_counter() - self._saved >= self.period:
            self.save()

    def seconds(self) -> float:
        """Training seconds of the run so far, earlier attempts included."""
        return self.seconds_before + time.perf_counter() - self._started

    def save(self) -> None:
        """Writes the state after the current iteration (atomically: a kill during the
        write leaves the previous file)."""
        import torch

        from fcos_d2.engine.resume import get_rng_states
        from fcos_d2.modeling.losses import loss_normalizer_states

        model = self.trainer.model
        state = {"iteration": self.trainer.iter + 1, "config": self.config,
                 "model": model.state_dict(), "optimizer": self.trainer.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(),
                 "loss_normalizers": loss_normalizer_states(model),
                 "losses": self.recorder.values, "rng": get_rng_states(),
                 "seconds": round(self.seconds(), 1), "resumed": self.resumed}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        torch.save(state, partial)
        os.replace(partial, self.path)
        self._saved = time.perf_counter()


def resume_state(path: Path, config: str) -> Optional[Dict[str, Any]]:
    """The state saved at `path` for a run of `config`, or None without a file; a file of
    another config (its run would continue under other settings) or one that does not
    load is refused, naming it."""
    import torch

    path = Path(path)
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)  # our own file
    except Exception as error:  # truncated or not ours: say which file, and what to do
        raise SystemExit(f"{path}: cannot be read as a saved run ({type(error).__name__}: "
                         f"{error}); delete it to start this run again") from None
    if not isinstance(state, dict) or state.get("config") != config:
        raise SystemExit(f"{path}: saved by a run of another config; delete it to start "
                         "this run again, or give this run another --output")
    return state


def restore(trainer, state: Dict[str, Any], scheduler, recorder) -> Dict[str, Any]:
    """Puts `trainer` where `state` was saved: its weights, optimizer, LR scheduler, loss
    normalizers and losses; then draws the batches trained on before from its data loader
    and sets the global generators to the saved ones. Returns the record's note:
    {"from_iteration", "exact"} (exact: the generators after those draws equalled the
    saved ones, so the data and augmentations go on as in an uninterrupted run)."""
    from fcos_d2.compat import training_data_iterator
    from fcos_d2.engine.resume import get_rng_states, set_rng_states
    from fcos_d2.modeling.losses import load_loss_normalizer_states

    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    load_loss_normalizer_states(trainer.model, state["loss_normalizers"])
    recorder.values = {k: list(v) for k, v in state["losses"].items()}
    batches = training_data_iterator(trainer)
    for _ in range(state["iteration"]):
        next(batches)
    exact = _equal_states(get_rng_states(), state["rng"])
    set_rng_states(state["rng"])
    return {"from_iteration": state["iteration"], "exact": exact}
