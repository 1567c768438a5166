"""Disk space and checkpoints: one clear error when a save fails, a warning before it does.

A checkpoint written to a full disk fails inside ``torch.save``, whose own error
(``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos ...``) hides the
``No space left on device`` behind it. ``FCOSCheckpointer.save`` turns any write that
failed with an OSError into ``CheckpointWriteError``: the file, the folder's free space,
about how much the checkpoint needs, the last complete checkpoint (still there: saves are
atomic) and how to resume. ``low_space_warning`` is the check before training.
"""
import os
import shutil
from typing import Any, Optional

import torch

__all__ = ["CheckpointWriteError", "describe_failed_save", "low_space_warning", "tensor_bytes"]


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a quota, an I/O error)."""


def tensor_bytes(state: Any) -> int:
    """The bytes of all tensors in nested dicts, lists and tuples: about the size of the
    file ``torch.save`` writes."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(v) for v in state)
    return 0


def free_bytes(folder: str) -> int:
    return shutil.disk_usage(folder).free


def _size(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if num_bytes < 1024 or unit == "GiB":
            return f"{num_bytes:.1f} {unit}" if unit != "B" else f"{int(num_bytes)} B"
        num_bytes /= 1024
    return ""


def os_error_in(error: BaseException) -> Optional[OSError]:
    """``error`` or the OSError it was raised while handling (torch.save's RuntimeError)."""
    while error is not None:
        if isinstance(error, OSError):
            return error
        error = error.__cause__ or error.__context__
    return None


def describe_failed_save(path: str, needed: int, cause: OSError,
                         last_complete: Optional[str]) -> str:
    """The message of CheckpointWriteError.

    Args:
        path: the checkpoint that could not be written.
        needed: about how many bytes it needs.
        cause: the OSError of the write (e.g. ``[Errno 28] No space left on device``).
        last_complete: the checkpoint ``last_checkpoint`` names, or None.
    """
    folder = os.path.dirname(os.path.abspath(path))
    free = free_bytes(folder)
    if last_complete:
        kept = (f"The last complete checkpoint, {last_complete}, is still there and "
                f"last_checkpoint names it: free some space (or move {folder} to a larger "
                "disk), then run the same command with --resume to continue from it.")
    else:
        kept = ("No checkpoint had been completed before: free some space, then run the "
                "same command again.")
    return (f"could not write the checkpoint {path}: {cause.strerror or cause} "
            f"(errno {cause.errno}). {folder} has {_size(free)} free; this checkpoint needs "
            f"about {_size(needed)}. The partly written temporary file was removed. {kept}")


def low_space_warning(folder: str, checkpoint_bytes: int, checkpoints: int = 3) -> str:
    """A warning when ``folder`` has room for fewer than ``checkpoints`` checkpoints of
    ``checkpoint_bytes``, else ""."""
    free = free_bytes(folder)
    if free >= checkpoints * checkpoint_bytes:
        return ""
    return (f"{folder} has {_size(free)} free, less than {checkpoints} checkpoints of about "
            f"{_size(checkpoint_bytes)} each: a checkpoint save may fail with a full disk. "
            "Free some space, or set OUTPUT_DIR on a larger disk.")
