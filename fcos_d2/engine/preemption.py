"""Save on preemption: a signal makes the training write a checkpoint and exit, resumable.

SLURM (and cloud spot instances) send SIGTERM, or a signal chosen with ``sbatch
--signal``, some seconds before they kill a job. ``launch`` installs
``install_preemption_handlers`` in every worker for ``--preemption-signals`` (default
SIGTERM). While a ``SaveOnPreemption`` hook runs the training loop, such a signal only
records the request; after each iteration the workers agree whether any of them got one
(an all-reduce of one number over a gloo group of their own), and if so all stop after
that same iteration: rank 0 writes ``model_<iteration>.pth`` through the trainer's
checkpointer (atomic, with ExactResume's data-stream and RNG states) and reads it back
(``final_checkpoint.checkpoint_problem``), everybody waits for it, and each worker exits
with ``PREEMPTED_EXIT_CODE`` (75, EX_TEMPFAIL: "try again later"); a checkpoint that fails
the check ends the job with ``UnverifiedCheckpointError`` instead. ``--resume`` continues
from that checkpoint exactly.

Further signals while the iteration finishes or the checkpoint is written are logged and
ignored, so they cannot cut the save short (SIGKILL still can; the save is atomic, and the
previous checkpoint stays). Outside the training loop (setup, ``--eval-only``, the final
evaluation) a preemption signal has its default effect: the process ends at once, unless
``handle_outside_training`` gave it a handler there (``fcos_d2.submit`` gives submitit's
requeue).

A process that spawned the workers (``launch`` with several workers per machine) passes
the signal on to them and waits for them to exit.
"""
import logging
import multiprocessing
import os
import signal
import threading
from typing import Any, Callable, Dict, Optional, Sequence

import torch
import torch.distributed as dist
from detectron2.engine import HookBase
from detectron2.utils import comm

from .final_checkpoint import FINAL_CHECKPOINT, UnverifiedCheckpointError, checkpoint_problem

__all__ = ["PREEMPTED_EXIT_CODE", "Preempted", "SaveOnPreemption", "forward_signals_to_children",
           "handle_outside_training", "install_preemption_handlers", "parse_signals",
           "received_signal"]

logger = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: a temporary failure, run again

# Process-wide, as signals are: the name of the first preemption signal received, and
# whether a SaveOnPreemption hook is running the loop (else a signal ends the process, or
# goes to its handler in "outside": signal number -> handler).
_state: Dict[str, Any] = {"requested": None, "listening": False, "outside": {}}


class Preempted(SystemExit):
    """Raised after the preemption checkpoint is written; exits with status 75."""

    def __init__(self):
        super().__init__(PREEMPTED_EXIT_CODE)


def parse_signals(names: Sequence[str]) -> list:
    """``["SIGTERM", "USR1"]`` -> signal numbers; an unknown name is a ValueError naming it."""
    numbers = []
    for name in names:
        full = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
        number = getattr(signal.Signals, full, None)
        if number is None or number in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"--preemption-signals: {name!r} is not a signal that can be "
                             "caught (e.g. SIGTERM, SIGUSR1, SIGUSR2)")
        numbers.append(number)
    return numbers


def install_preemption_handlers(signals: Sequence[int]) -> None:
    """Makes ``signals`` preemption requests in this (worker) process; main thread only."""
    _state["requested"] = None
    for number in signals:
        signal.signal(number, _on_preemption_signal)


def handle_outside_training(number: int, handler: Callable[[int, Any], None]) -> None:
    """Makes the preemption signal ``number`` call ``handler(number, frame)`` when it
    arrives outside the training loop (setup, evaluation), instead of ending the process."""
    _state["outside"][number] = handler


def received_signal() -> Optional[str]:
    """The name of the first preemption signal this process received, or None."""
    return _state["requested"]


def _on_preemption_signal(number: int, frame) -> None:
    name = signal.Signals(number).name
    if not _state["listening"] and number in _state["outside"]:
        _state["outside"][number](number, frame)
        return
    if not _state["listening"]:  # no training loop to finish: the default effect
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        return
    if _state["requested"] is None:
        _state["requested"] = name
        logger.warning(f"{name} received: finishing this iteration, then saving a checkpoint "
                       f"and exiting with status {PREEMPTED_EXIT_CODE} (resume with --resume)")
    else:
        logger.warning(f"{name} received again: ignored, the checkpoint is being written")


def forward_signals_to_children(signals: Sequence[int]) -> Callable[[], None]:
    """In a process that spawns the workers: passes ``signals`` on to its child processes
    instead of ending. Returns a function that restores the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def forward(number: int, frame) -> None:
        for child in multiprocessing.active_children():
            os.kill(child.pid, number)

    previous = {number: signal.signal(number, forward) for number in signals}
    return lambda: [signal.signal(n, handler) for n, handler in previous.items()]


class SaveOnPreemption(HookBase):
    """After each iteration, stops the training when a worker got a preemption signal:
    saves a checkpoint of that iteration (rank 0) and exits with status 75 (all workers).

    Register it after the PeriodicCheckpointer (the LR scheduler has stepped; no second
    file when that one just saved) and before the EvalHook (no evaluation first).

    Args:
        checkpointer: the trainer's checkpointer (its checkpointables include the trainer).
        exact_resume: train_net.py's ExactResume hook, whose states of every worker are
            gathered into this checkpoint; None: the checkpoint has no data-stream state.
    """

    def __init__(self, checkpointer, exact_resume=None):
        self._checkpointer = checkpointer
        self._exact_resume = exact_resume
        self._group = None

    def before_train(self):
        if comm.get_world_size() > 1:  # gloo: a CPU tensor, whatever the training backend
            self._group = dist.new_group(backend="gloo")
        _state["listening"] = True

    def after_train(self):
        _state["listening"] = False

    def after_step(self):
        if not self._anyone_requested():
            return
        iteration = self.trainer.iter
        if self._exact_resume is not None:
            self._exact_resume.capture()
        name = f"model_{iteration:07d}"
        path = os.path.join(self._checkpointer.save_dir, f"{name}.pth")
        problem = None
        if comm.is_main_process():
            saved = self._just_saved(name)
            if saved is None:
                self._checkpointer.save(name, iteration=iteration)
            path = saved or path
            problem = checkpoint_problem(path, iteration)
        self._agree_saved(problem)  # nobody exits before the file is complete and verified
        logger.warning(f"Preempted ({_state['requested'] or 'signal to another worker'}): "
                       f"stopped after iteration {iteration}, checkpoint {path} (verified); "
                       f"exiting with status {PREEMPTED_EXIT_CODE}. Resume with --resume.")
        raise Preempted()

    def _agree_saved(self, problem: Optional[str]) -> None:
        """Every worker waits for rank 0's checkpoint, then all raise if it failed its
        check: a preempted job exits 75 only with a checkpoint to resume from."""
        failed = problem is not None
        if self._group is not None:
            flag = torch.tensor([int(failed)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
            failed = bool(flag.item())
        if failed:
            raise UnverifiedCheckpointError(
                f"preempted after iteration {self.trainer.iter}, and its checkpoint is not in "
                f"place: {problem or 'see the log of rank 0'}. Output folder: "
                f"{self._checkpointer.save_dir}. Not exiting with status "
                f"{PREEMPTED_EXIT_CODE}: a resume would repeat iterations; check the disk.")

    def _just_saved(self, name: str) -> Optional[str]:
        """The file in which the periodic checkpointer saved this iteration, if it did."""
        if not self._checkpointer.has_checkpoint():
            return None
        last = self._checkpointer.get_checkpoint_file()
        final = self.trainer.iter >= self.trainer.max_iter - 1
        if os.path.basename(last) == f"{name}.pth" or (
                final and os.path.basename(last) == FINAL_CHECKPOINT):
            return last
        return None

    def _anyone_requested(self) -> bool:
        mine = _state["requested"] is not None
        if self._group is None:
            return mine
        flag = torch.tensor([int(mine)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return bool(flag.item())
