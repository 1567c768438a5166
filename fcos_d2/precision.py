"""Where bf16 may run on the CPU at all (``MODEL.FCOS.CPU_BF16``): the CPU's native-bf16
probe and the policy that turns bf16 off where it would be emulated.

CPUs with AVX512-BF16 or AMX (x86) or the BF16 extension (ARM) run bf16 convolutions about
twice as fast as float32 ones; elsewhere bf16 is emulated and about 10x slower than float32,
so by default (``CPU_BF16 "auto"``) bf16 is used only where the CPU has it natively.

This module sits below both the model (bf16 inference, ``fcos_d2.modeling``) and the
trainer (bf16 training, ``fcos_d2.engine.amp``), which import it.
"""
import functools
import logging
import platform
import subprocess
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import torch

__all__ = ["CPU_BF16_POLICIES", "cpu_autocast_dtype", "cpu_bf16_report", "cpu_has_native_bf16",
           "resolve_cpu_bf16"]

logger = logging.getLogger("fcos_d2")

# /proc/cpuinfo flags (x86 "flags", ARM "Features") of CPUs that compute bf16 natively.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# torch.cpu.get_capabilities() keys (cpuinfo's CPUID probe) of the same instruction sets.
NATIVE_BF16_CAPABILITIES = ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16")
# MODEL.FCOS.CPU_BF16: "auto" uses bf16 on a CPU only where it is native, "always" anyway.
CPU_BF16_POLICIES = ("auto", "always")


def _from_torch_probe() -> Optional[bool]:
    """The CPUID probe PyTorch itself ships (cpuinfo); None where this torch lacks it."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)
    if capabilities is None:
        return None
    try:
        found = capabilities()
    except Exception:  # a probe that fails says nothing  # noqa: BLE001
        return None
    return any(bool(found.get(key, False)) for key in NATIVE_BF16_CAPABILITIES)


def _from_cpuinfo(cpuinfo: str) -> Optional[bool]:
    """The kernel's view: x86 "flags" or ARM "Features" lines; None where unreadable."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    flags = {flag for line in text.splitlines() if line.split(":", 1)[0].strip() in
             ("flags", "Features") for flag in line.split(":", 1)[1].split()}
    return any(flag in flags for flag in NATIVE_BF16_FLAGS) if flags else None


def _from_sysctl() -> Optional[bool]:
    """macOS on Apple silicon: ``hw.optional.arm.FEAT_BF16``; None elsewhere."""
    if platform.system() != "Darwin":
        return None
    try:
        out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out == "1" if out in ("0", "1") else None


def cpu_bf16_report(cpuinfo: str = "/proc/cpuinfo",
                    probes: Optional[Dict[str, Callable[[], Optional[bool]]]] = None
                    ) -> Dict[str, Optional[bool]]:
    """What each source says about native bf16: {"torch": ..., "cpuinfo": ..., "sysctl": ...},
    each True, False, or None where the source is not available."""
    if probes is None:
        probes = {"torch": _from_torch_probe, "cpuinfo": lambda: _from_cpuinfo(cpuinfo),
                  "sysctl": _from_sysctl}
    return {name: probe() for name, probe in probes.items()}


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo", **report_kwargs) -> Optional[bool]:
    """Whether the CPU computes bf16 natively: True if a source (PyTorch's CPUID probe,
    /proc/cpuinfo, macOS sysctl) lists AVX512-BF16, AMX-BF16 or ARM BF16; False if a source
    could tell and none lists it; None where no source could tell."""
    answers = [v for v in cpu_bf16_report(cpuinfo, **report_kwargs).values() if v is not None]
    if not answers:
        return None
    return any(answers)


@functools.lru_cache(maxsize=None)
def _native_here() -> Optional[bool]:
    """``cpu_has_native_bf16()`` of this machine, probed once per process."""
    return cpu_has_native_bf16()


@functools.lru_cache(maxsize=None)
def _log_once(message: str) -> None:
    logger.warning(message)


def resolve_cpu_bf16(policy: str, *, what: str, key: str,
                     native: Optional[bool] = None) -> Tuple[bool, str]:
    """Whether ``what`` (bf16 asked for by config ``key``) runs in bf16 on this CPU.

    Args:
        policy: MODEL.FCOS.CPU_BF16: "auto" (bf16 only where native; where the CPU cannot
            tell, bf16 as asked) or "always".
        native: the CPU's answer; default ``cpu_has_native_bf16()`` of this machine.
    Returns:
        (use bf16, the log line when it falls back to float32, else "").
    """
    if policy not in CPU_BF16_POLICIES:
        raise ValueError(f"MODEL.FCOS.CPU_BF16: unknown '{policy}', expected one of "
                         f"{CPU_BF16_POLICIES}")
    native = _native_here() if native is None else native
    if policy == "always" or native is not False:
        return True, ""
    return False, (f"{key}: this CPU has no native bf16 (neither AVX512-BF16/AMX nor ARM "
                   f"BF16), where bf16 is emulated and about 10x slower than float32: {what} "
                   "runs in float32 instead; MODEL.FCOS.CPU_BF16 always forces bf16")


def cpu_autocast_dtype(requested: torch.dtype, policy: str, *, what: str, key: str,
                       native: Optional[bool] = None) -> torch.dtype:
    """``requested`` unless it is bf16 on a CPU without native bf16 under policy "auto":
    then float32, said once per process in the log."""
    if requested != torch.bfloat16:
        return requested
    use, message = resolve_cpu_bf16(policy, what=what, key=key, native=native)
    if message:
        _log_once(message)
    return torch.bfloat16 if use else torch.float32
