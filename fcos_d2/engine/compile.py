"""``MODEL.FCOS.COMPILE``: training with the backbone and head compiled by
``torch.compile`` (inductor), in place.

``nn.Module.compile`` compiles a module's forward where it is, so the model keeps its
modules and its state dict keys: checkpoints, DDP, exact resume and the evaluation copy
(fcos_d2.modeling.fast_inference, which runs eager: a deep copy does not take the compiled
forward) are unchanged. Assignment, losses and post-processing stay eager: their shapes
depend on the data, and the dense part is nearly all of a step's time.

The first iterations compile (minutes on a CPU for an R-50); a new input size compiles
again, after which inductor treats sizes as dynamic. ``ReportCompileTime`` logs what the
first iteration cost.
"""
import logging
import shutil
import time
from typing import List

import torch
from detectron2.engine import HookBase
from torch import nn

logger = logging.getLogger(__name__)

COMPILED_PARTS = ("backbone", "head")


def compiler_missing(device: str) -> str:
    """"" where inductor can compile for `device` ("cpu" or "cuda..."), else why not."""
    if not hasattr(torch, "compile") or not hasattr(nn.Module, "compile"):
        return f"torch {torch.__version__} has no torch.compile / nn.Module.compile"
    if torch.device(device).type == "cuda":
        from torch.utils._triton import has_triton

        return "" if has_triton() else "inductor needs triton on the GPU; it is not installed"
    if not any(shutil.which(name) for name in ("c++", "g++", "clang++")):
        return "no C++ compiler (c++, g++ or clang++) on PATH: inductor needs one on the CPU"
    return ""


def compile_in_place(model: nn.Module, device: str,
                     key: str = "MODEL.FCOS.COMPILE") -> List[str]:
    """Compiles ``model.backbone`` and ``model.head`` in place; returns their names.

    Raises:
        RuntimeError: naming `key` where no compiler is available or the model has
            neither part.
    """
    missing = compiler_missing(device)
    if missing:
        raise RuntimeError(f"{key} True: {missing}. Install one, or set {key} False to "
                           f"train eager.")
    parts = [name for name in COMPILED_PARTS if isinstance(getattr(model, name, None),
                                                           nn.Module)]
    if not parts:
        wanted = " or ".join(COMPILED_PARTS)
        raise RuntimeError(f"{key} True: {type(model).__name__} has no {wanted} module to "
                           f"compile")
    for name in parts:
        getattr(model, name).compile()
    return parts


class ReportCompileTime(HookBase):
    """Logs the time of the first iteration (the compilation), once per run."""

    def __init__(self, parts: List[str]):
        self.parts = parts
        self._start = None  # perf_counter at the first step, until it is reported
        self._reported = False

    def before_step(self):
        if self._start is None:
            self._start = time.perf_counter()

    def after_step(self):
        if not self._reported:
            seconds = time.perf_counter() - self._start
            logger.info(f"MODEL.FCOS.COMPILE: the first iteration, which compiled the "
                        f"{' and '.join(self.parts)}, took {seconds:.1f} s")
            self._reported = True
