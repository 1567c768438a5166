"""Timing helpers of the speed benchmark: contenders timed in turn (medians after a
warm-up), autocast of the low-precision rows, one training step, tables and the peak
memory of a process."""
import contextlib
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

import fcos_d2  # noqa: F401  (before detectron2)
from fcos_d2.engine.amp import cpu_has_native_bf16

from benchmarks.speed import contenders as bc


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def interleaved_medians(fns: Dict[str, Callable[[], object]], repeats: int, device: str,
                        warmup: int = 1) -> Dict[str, float]:
    """Median seconds of each function, timed in turn (a, b, c, a, b, c, ...)."""
    times = {name: [] for name in fns}
    for i in range(warmup + repeats):
        for name, fn in fns.items():
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def low_precision(device: str) -> torch.dtype:
    """bf16 autocast on the CPU; fp16 AMP on a GPU."""
    return torch.bfloat16 if device == "cpu" else torch.float16


def autocast(device: str, enabled: bool):
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device, dtype=low_precision(device))


def size(args) -> tuple:
    return (512, 768) if args.quick else (800, 1216)


def print_table(title: str, results: List[dict], baseline: str) -> None:
    """One line per result; ``ratio`` is its time over the ``baseline`` contender's, and
    its time over its arithmetic floor where it has one (``benchmarks.speed.floor``)."""
    print(f"\n[{title}]")
    base = {r["batch"]: r["seconds"] for r in results if r["contender"] == baseline}
    for r in results:
        r["ratio_to_" + baseline.replace(" ", "_")] = r["seconds"] / base[r["batch"]]
        print(f"  {r['contender']:32s} batch {r['batch']}  {r['seconds'] * 1e3:9.1f} ms/batch  "
              f"{r['seconds'] / r['batch'] * 1e3:9.1f} ms/image  "
              f"{r['batch'] / r['seconds']:6.2f} images/s  {r['seconds'] / base[r['batch']]:.2f}x"
              + (f"  {r['seconds'] / r['floor_seconds']:6.1f}x floor" if "floor_seconds" in r
                 else ""))


def bf16_kind(device: str) -> str:
    """"native" or "emulated" (fcos_d2.engine.amp.cpu_has_native_bf16), "unknown" where the
    CPU cannot tell; "" on a GPU. An emulated bf16 ratio is no result."""
    if device != "cpu":
        return ""
    native = cpu_has_native_bf16()
    return "unknown" if native is None else ("native" if native else "emulated")


def low_tag(device: str) -> str:
    """The low-precision rows' tag: "bf16 native" / "bf16 emulated" on a CPU, "fp16 AMP"."""
    return f"bf16 {bf16_kind(device)}" if device == "cpu" else "fp16 AMP"


def autocast_call(device: str, fn: Callable, *args):
    with autocast(device, True):
        return fn(*args)

def training_step(contender: bc.Contender, device: str, low: bool) -> Callable[[], None]:
    """One iteration of ``contender`` on a fixed batch with its project's optimizer, the
    forward under autocast when ``low`` (with a gradient scaler on CUDA, as detectron2's
    AMPTrainer)."""
    model = contender.model.train()
    optimizer = contender.optimizer(model)
    scaler = torch.amp.GradScaler("cuda") if device == "cuda" and low else None

    def step(images, targets):
        with autocast(device, low):
            loss = contender.loss(images, targets)
        optimizer.zero_grad()
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    return step

def backbone_head_macs(contender: bc.Contender, images: torch.Tensor) -> float:
    from fvcore.nn import FlopCountAnalysis

    class BackboneHead(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return contender.backbone_head(x)

    counter = FlopCountAnalysis(BackboneHead(contender.model), (images,))
    counter.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    return counter.total()

def rss() -> float:
    """This process's RSS high-water mark in MiB: VmHWM, which starts afresh at exec
    (getrusage's ru_maxrss would carry over the parent's peak)."""
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024
