"""Reading checkpoint files without running code from them.

A pickle can call any Python function while it loads, so a checkpoint from the internet
could run code. Files are therefore read as data only:

- PyTorch files (``.pth``, ``.pt``, ``.pyth``, ...) with ``torch.load(weights_only=True)``,
  which rebuilds tensors, numbers, strings and containers only; numpy arrays (found in
  some converted checkpoints) are allowed as well.
- Detectron / detectron2 model-zoo pickles (``.pkl``) with an unpickler that rebuilds
  numpy arrays, numbers, strings and containers only (the ImageNet backbones that the
  configs start from are such files).

Anything else (another class, a function) needs ``allow_pickle=True`` (in train_net.py:
``MODEL.WEIGHTS_ALLOW_PICKLE True``), which loads the file with plain pickle, after a
warning. A file that is truncated or otherwise unreadable raises ``CheckpointReadError``
naming it.
"""
import codecs
import collections
import logging
import os
import pickle
import re
from typing import Any, Dict, List, Optional

import numpy as np
import torch

logger = logging.getLogger(__name__)

OPT_IN = "MODEL.WEIGHTS_ALLOW_PICKLE True"  # how a user of train_net.py opts in


class CheckpointReadError(RuntimeError):
    """A checkpoint file is missing, truncated or damaged."""


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file needs Python objects other than data to load (pickle opt-in)."""


def _data_globals() -> Dict[str, Any]:
    """The globals that pickles of numpy arrays and scalars name, under numpy 1's and 2's
    module names (numpy 2 moved ``numpy.core`` to ``numpy._core``), OrderedDict, and the
    codec function that protocol 2 rebuilds bytes with."""
    reconstruct = np.zeros(1).__reduce__()[0]  # numpy's array rebuilder
    scalar = np.float32(0).__reduce__()[0]  # numpy's scalar rebuilder
    found = {"numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype,
             "collections.OrderedDict": collections.OrderedDict,
             "_codecs.encode": codecs.encode}  # bytes, as protocol 2 writes them in Python 3
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        found[f"{module}._reconstruct"] = reconstruct
        found[f"{module}.scalar"] = scalar
    return found


_DATA_GLOBALS = _data_globals()
# torch's weights-only unpickler also checks the classes whose state it sets: numpy 2's
# dtype classes (numpy.dtypes.Float32DType, ...), numeric types only.
_TORCH_SAFE_GLOBALS = [(v, k) for k, v in _DATA_GLOBALS.items()] + sorted(
    {type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDG"} - {np.dtype}, key=str)


class _DataOnlyUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays, numbers, strings and containers; refuses any other global."""

    def find_class(self, module: str, name: str) -> Any:
        if f"{module}.{name}" in _DATA_GLOBALS:
            return _DATA_GLOBALS[f"{module}.{name}"]
        raise UnsafeCheckpointError(f"{module}.{name}")


def _unsafe_message(path: str, names: List[str]) -> str:
    return (f"{path}: loading it needs the Python object(s) {', '.join(names)}, and a pickle "
            f"that names objects can run code. If you trust this file, opt in with "
            f"{OPT_IN} (or allow_pickle=True)")


def _warn_pickle(path: str, names: List[str]) -> None:
    logger.warning(f"Loading {path} with pickle ({OPT_IN}): it names {', '.join(names)}; a "
                   f"pickle can run code, so load only files you trust.")


def _read_error(path: str, error: BaseException) -> CheckpointReadError:
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    detail = detail.split(". ")[0]  # torch goes on with advice that does not apply here
    size = f"{os.path.getsize(path)} bytes, " if os.path.isfile(path) else ""
    return CheckpointReadError(f"{path}: cannot be read as a checkpoint ({size}truncated or "
                               f"damaged?): {detail}")


def load_pickle_file(path: str, *, allow_pickle: bool = False) -> Any:
    """Loads a Detectron-style ``.pkl`` file (latin1 strings, as Python 2 wrote them).

    Raises:
        UnsafeCheckpointError: it names objects other than data and ``allow_pickle`` is
            False.
        CheckpointReadError: it is missing, truncated or damaged.
    """
    try:
        with open(path, "rb") as f:
            return _DataOnlyUnpickler(f, encoding="latin1").load()
    except UnsafeCheckpointError as error:
        if not allow_pickle:
            raise UnsafeCheckpointError(_unsafe_message(path, [str(error)])) from None
        _warn_pickle(path, [str(error)])
    except Exception as error:  # OSError, EOFError, UnpicklingError, ... : not a pickle
        raise _read_error(path, error) from None
    with open(path, "rb") as f:
        return pickle.load(f, encoding="latin1")


def _unsafe_globals(path: str, error: Exception) -> Optional[List[str]]:
    """The globals that made a weights-only load fail, or None if it failed otherwise."""
    if not isinstance(error, pickle.UnpicklingError):
        return None
    try:  # public since torch 2.5; zip checkpoints only
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # legacy (non-zip) format: torch names the first one in its message
        names = re.findall(r"Unsupported global: GLOBAL ([\w.]+)", str(error))[:1]
    return [n for n in names if n not in _DATA_GLOBALS] or None


def load_torch_file(path: str, *, allow_pickle: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU, numpy arrays allowed.

    Raises:
        UnsafeCheckpointError: it names objects other than data and ``allow_pickle`` is
            False.
        CheckpointReadError: it is missing, truncated or damaged.
    """
    try:
        with torch.serialization.safe_globals(_TORCH_SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises RuntimeError, EOFError, KeyError, ... here
        names = _unsafe_globals(path, error)
        if names is None:
            raise _read_error(path, error) from None
        if not allow_pickle:
            raise UnsafeCheckpointError(_unsafe_message(path, names)) from None
        _warn_pickle(path, names)
    return torch.load(path, map_location="cpu", weights_only=False)


def load_model_state_dict(path: str) -> Dict[str, Any]:
    """The weights of a checkpoint file to convert: its ``"model"`` entry, or the whole
    file if it has none; loaded as ``load_torch_file`` does (data only).

    Raises:
        CheckpointReadError: the file is unreadable or not a dict.
        UnsafeCheckpointError: as ``load_torch_file``.
    """
    checkpoint = load_torch_file(path)
    if not isinstance(checkpoint, dict):
        raise CheckpointReadError(f"{path}: expected a dict, got {type(checkpoint).__name__}")
    return checkpoint.get("model", checkpoint)


def stored_iteration(path: str) -> Optional[int]:
    """The "iteration" of a training checkpoint, read without reading its tensors (memory
    mapped); None if it has none or cannot be read so (legacy format, damaged, ...)."""
    try:
        with torch.serialization.safe_globals(_TORCH_SAFE_GLOBALS):
            loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # whether it reads at all is found out when it is loaded
        return None
    iteration = loaded.get("iteration") if isinstance(loaded, dict) else None
    return iteration if isinstance(iteration, int) else None


def detectron_pickle_to_checkpoint(data: Dict[str, Any]) -> Dict[str, Any]:
    """What detectron2's DetectionCheckpointer makes of a loaded ``.pkl``: detectron2
    model-zoo files as they are; Detectron (Caffe2) files as their blobs, to be matched to
    the model's names by detectron2's heuristics."""
    if "model" in data and "__author__" in data:
        return data
    blobs = data.get("blobs", data)  # detection models have "blobs", ImageNet ones do not
    blobs = {k: v for k, v in blobs.items() if not k.endswith("_momentum")}
    return {"model": blobs, "__author__": "Caffe2", "matching_heuristics": True}


def pycls_to_checkpoint(data: Dict[str, Any]) -> Dict[str, Any]:
    """What detectron2 makes of a pycls ``.pyth`` checkpoint (its ``model_state``)."""
    if "model_state" not in data:
        raise CheckpointReadError("a pycls .pyth checkpoint must contain 'model_state'")
    model = {k: v for k, v in data["model_state"].items()
             if not k.endswith("num_batches_tracked")}
    return {"model": model, "__author__": "pycls", "matching_heuristics": True}
