"""Mixed-precision training on the CPU: ``SOLVER.AMP.ENABLED`` where there is no GPU.

detectron2's ``AMPTrainer`` (v0.6 and main) runs the forward pass under CUDA autocast with
a CUDA ``GradScaler`` and asserts that CUDA is available. On a CPU, bf16 autocast needs no
scaler: bf16 has float32's exponent range, so gradients do not underflow. CPUs with
AVX512-BF16 or AMX (x86) or the BF16 extension (ARM) run bf16 convolutions about twice as
fast as float32 ones; elsewhere bf16 is emulated and about 10x slower than float32, so by
default (``CPU_BF16 "auto"``) bf16 is used only where the CPU has it natively
(``fcos_d2.precision``).
"""
import contextlib
import time

import torch
from detectron2.engine import SimpleTrainer

# The CPU-bf16 policy lives below the model and the trainer; re-exported here for callers
# that import it from the trainer's package.
from ..precision import (CPU_BF16_POLICIES, cpu_autocast_dtype, cpu_bf16_report,  # noqa: F401
                         cpu_has_native_bf16, resolve_cpu_bf16)

__all__ = ["CPUAMPTrainer", "CPU_BF16_POLICIES", "cpu_autocast_dtype", "cpu_bf16_report",
           "cpu_has_native_bf16", "resolve_cpu_bf16"]


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
            precision: the autocast dtype (bfloat16; float16 runs, but slowly on CPUs), or
                float32 for no autocast (bf16 asked for on a CPU without native bf16).
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
        with (contextlib.nullcontext() if self.precision == torch.float32
              else torch.autocast("cpu", dtype=self.precision)):
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
