"""Mixed-precision training on the CPU: ``SOLVER.AMP.ENABLED`` where there is no GPU.

detectron2's ``AMPTrainer`` (v0.6 and main) runs the forward pass under CUDA autocast with
a CUDA ``GradScaler`` and asserts that CUDA is available. On a CPU, bf16 autocast needs no
scaler: bf16 has float32's exponent range, so gradients do not underflow. CPUs with
AVX512-BF16 or AMX run bf16 convolutions about twice as fast as float32 ones.
"""
import time
from pathlib import Path
from typing import Optional

import torch
from detectron2.engine import SimpleTrainer

__all__ = ["CPUAMPTrainer", "cpu_has_native_bf16", "slow_bf16_warning"]

# /proc/cpuinfo flags of CPUs that compute bf16 natively (AVX512-BF16, AMX).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> Optional[bool]:
    """Whether the CPU lists a native bf16 instruction set; None where ``cpuinfo`` cannot
    be read (not Linux)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    flags = {flag for line in text.splitlines() if line.startswith("flags")
             for flag in line.split(":", 1)[1].split()}
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def slow_bf16_warning(cpuinfo: str = "/proc/cpuinfo") -> str:
    """A warning for SOLVER.AMP.ENABLED on a CPU without native bf16, else ""."""
    if cpu_has_native_bf16(cpuinfo) is not False:
        return ""
    return ("SOLVER.AMP.ENABLED: this CPU has neither AVX512-BF16 nor AMX, so bf16 autocast "
            "is emulated and may train slower than float32; set SOLVER.AMP.ENABLED False "
            "to train in float32")


class CPUAMPTrainer(SimpleTrainer):
    """``SimpleTrainer`` whose forward pass (model and losses) runs under CPU autocast.

    Backward and the optimizer step run outside autocast, as PyTorch recommends; the
    parameters, their gradients and the optimizer state stay float32. The model's losses
    are expected to be computed in float32 (``fcos_d2.modeling.losses`` does so).
    """

    def __init__(self, model, data_loader, optimizer, precision: torch.dtype = torch.bfloat16):
        """
        Args:
            model, data_loader, optimizer: as for ``SimpleTrainer``.
            precision: the autocast dtype (bfloat16; float16 runs, but slowly on CPUs).
        """
        super().__init__(model, data_loader, optimizer)
        self.precision = precision

    @classmethod
    def replacing(cls, trainer: SimpleTrainer,
                  precision: torch.dtype = torch.bfloat16) -> "CPUAMPTrainer":
        """A CPUAMPTrainer that takes over ``trainer``'s model, optimizer and data iterator
        (and any other state), without starting a second data-loader iterator."""
        new = cls.__new__(cls)
        new.__dict__.update(trainer.__dict__)
        new.precision = precision
        return new

    def run_step(self):
        assert self.model.training, "[CPUAMPTrainer] model was changed to eval mode!"
        start = time.perf_counter()
        data = next(self._data_loader_iter)
        data_time = time.perf_counter() - start
        with torch.autocast("cpu", dtype=self.precision):
            loss_dict = self.model(data)
            if isinstance(loss_dict, torch.Tensor):
                losses, loss_dict = loss_dict, {"total_loss": loss_dict}
            else:
                losses = sum(loss_dict.values())
        self.optimizer.zero_grad()
        losses.backward()
        if hasattr(self, "after_backward"):  # detectron2 main's hook point; not in v0.6
            self.after_backward()
        self._write_metrics(loss_dict, data_time)
        self.optimizer.step()
