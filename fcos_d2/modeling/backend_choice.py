"""What ``MODEL.FCOS.INFERENCE_BACKEND "auto"`` (the default) runs, and why.

It chooses from three things: what the device computes natively (:func:`cpu_capabilities`,
the one place that asks the CPU, so that tests can fake it), how much work the call has
ahead (``expected_images``: one demo picture, a dataset's length, or None for a model that
stays loaded and serves, as ``Predictor`` and ``DefaultPredictor`` do) and, on CPUs without
AMX, how large the padded input is (``pixels``):

- a CPU with AMX: "bf16_compiled" where the work pays for the compile (no count known, at
  least ``COLD_COMPILE_PAYS_AFTER`` images, or at least ``WARM_COMPILE_PAYS_AFTER`` when
  this machine's compile cache already holds the model, ``compile_cache.py``), else eager
  under bf16 autocast, which needs no compile;
- a CPU with native bf16 but no AMX (AVX512-BF16 alone): "bf16_compiled" only for a
  dataset whose padded inputs are large enough and whose image count repays the compile
  (``NO_AMX_COMPILE_PAYS_AFTER``: 1000 images of at least 800x1216's pixels, 2000 of at
  least 512x768's), else eager under bf16 autocast: a compile gains only 8-13% an image
  there, less the smaller the input, loses at R-18 320x480, and its first call takes 20-25
  s even from the cache (docs/speed.md), too long for a served model;
- a CPU without native bf16 (AVX2 only, where bf16 is emulated and slower than float32):
  eager float32, said in a warning;
- a GPU: eager under float16 autocast (the compiled backends are CPU paths);
- int8 ("int8_pt2e") never: it runs at 3.3x bf16's time on AMX (docs/speed.md).

``FCOS_D2_AUTO_BACKEND`` in the environment (eager, bf16_compiled or int8_pt2e) pins what
"auto" runs on this machine, as the test suite does for "eager".
"""
import dataclasses
import functools
import os
from typing import Dict, Mapping, Optional

import torch

from ..precision import cpu_has_native_bf16

__all__ = ["AUTO_OVERRIDE_ENV", "BackendChoice", "COLD_COMPILE_PAYS_AFTER", "INFERENCE_BACKENDS",
           "NO_AMX_COMPILE_PAYS_AFTER", "WARM_COMPILE_PAYS_AFTER", "check_inference_backend",
           "choose_backend", "cpu_capabilities", "no_amx_images_needed"]

INFERENCE_BACKENDS = ("auto", "eager", "bf16_compiled", "int8_pt2e")
AUTO_OVERRIDE_ENV = "FCOS_D2_AUTO_BACKEND"
# Images from which a compile pays. Cold: R-50 at 800x1216 on the AMX Xeon saves about
# 0.25 s an image compiled over eager bf16 (docs/speed.md), a cold compile takes minutes.
COLD_COMPILE_PAYS_AFTER = 500
# Warm: the compile cache holds the model, so compiling is loading (seconds).
WARM_COMPILE_PAYS_AFTER = 10
# Without AMX (AVX512-BF16 alone), measured on an AMD EPYC with R-50, cold caches
# (docs/speed.md): the compiled graph saves 34-60 ms an image at 800x1216 (0.87-0.93x eager
# bf16), 23 at 640x960 (0.92x) and 21 at 512x768 (0.89x), and its first call takes 20-25 s,
# also from the cache; at R-18 320x480 it was the slower one (1.04x). So it repays itself
# after 330-670 images at 800x1216 and about 1000-1100 at the two smaller sizes: per
# (smallest padded pixels, images needed), largest first, with a margin.
NO_AMX_COMPILE_PAYS_AFTER = ((800 * 1216, 1000), (512 * 768, 2000))
# torch.cpu.get_capabilities() keys of the int8 dot-product units oneDNN uses.
NATIVE_INT8_CAPABILITIES = ("amx_int8", "avx512_vnni", "avx_vnni")


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    """backend: "eager", "bf16_compiled" or "int8_pt2e"; dtype: eager's autocast dtype
    (None: the model's ``INFERENCE_DTYPE``); reason: the log line ("" when run as asked);
    warning: whether the line is a fallback to warn about."""
    backend: str
    dtype: Optional[torch.dtype] = None
    reason: str = ""
    warning: bool = False


def check_inference_backend(backend: str) -> str:
    """``backend`` if it is one of ``INFERENCE_BACKENDS``, else a ValueError naming the key."""
    if backend not in INFERENCE_BACKENDS:
        raise ValueError(f"MODEL.FCOS.INFERENCE_BACKEND: unknown '{backend}', expected one of "
                         f"{INFERENCE_BACKENDS}")
    return backend


@functools.lru_cache(maxsize=None)
def cpu_capabilities() -> Dict[str, bool]:
    """{"amx": AMX-BF16, "native_bf16": AVX512-BF16/AMX-BF16/ARM BF16, "native_int8":
    AMX-INT8 or VNNI} of this CPU, from PyTorch's CPUID probe and /proc/cpuinfo."""
    probe = getattr(torch.cpu, "get_capabilities", None)
    found = probe() if probe is not None else {}
    return {"amx": bool(found.get("amx_bf16")),
            "native_int8": any(bool(found.get(k)) for k in NATIVE_INT8_CAPABILITIES),
            "native_bf16": bool(cpu_has_native_bf16())}


def _explicit(backend: str, device_type: str) -> BackendChoice:
    if backend != "eager" and device_type != "cpu":
        return BackendChoice("eager", reason=(
            f"MODEL.FCOS.INFERENCE_BACKEND {backend}: the model is on {device_type}, the "
            "compiled backends are CPU paths: running eager"), warning=True)
    return BackendChoice(backend)


def _work(expected_images: Optional[int]) -> str:
    return "a model that stays loaded" if expected_images is None else \
        f"{expected_images} image{'s' if expected_images != 1 else ''} ahead"


def _on_native_bf16(expected_images: Optional[int], warm: bool, amx: bool,
                    pixels: Optional[int]) -> BackendChoice:
    if not amx:
        return _without_amx(expected_images, pixels)
    needed = WARM_COMPILE_PAYS_AFTER if warm else COLD_COMPILE_PAYS_AFTER
    cache = "the compile cache holds this model" if warm else "nothing cached yet"
    if expected_images is None or expected_images >= needed:
        return BackendChoice("bf16_compiled", reason=(
            f"MODEL.FCOS.INFERENCE_BACKEND auto: bf16_compiled (native bf16: AMX; "
            f"{_work(expected_images)}, {cache}: the compile pays)"))
    return BackendChoice("eager", torch.bfloat16, reason=(
        f"MODEL.FCOS.INFERENCE_BACKEND auto: eager bfloat16 (native bf16: AMX; "
        f"{_work(expected_images)}, {cache}: a compile pays from {needed} images)"))


def no_amx_images_needed(pixels: Optional[int]) -> Optional[int]:
    """Images of ``pixels`` padded pixels from which a compile pays on a CPU without AMX
    (``NO_AMX_COMPILE_PAYS_AFTER``); None: it never does (small or unknown inputs)."""
    for smallest, images in NO_AMX_COMPILE_PAYS_AFTER:
        if (pixels or 0) >= smallest:
            return images
    return None


def _without_amx(expected_images: Optional[int], pixels: Optional[int]) -> BackendChoice:
    units = "native bf16: AVX512-BF16 without AMX"
    needed = no_amx_images_needed(pixels)
    if needed is None:
        return BackendChoice("eager", torch.bfloat16, reason=(
            f"MODEL.FCOS.INFERENCE_BACKEND auto: eager bfloat16 ({units}; inputs under "
            "512x768's pixels, where a compile does not pay without AMX)"))
    if expected_images is not None and expected_images >= needed:
        return BackendChoice("bf16_compiled", reason=(
            f"MODEL.FCOS.INFERENCE_BACKEND auto: bf16_compiled ({units}; "
            f"{_work(expected_images)}: the compile's 20-25 s pays, saving 8-13% an image)"))
    return BackendChoice("eager", torch.bfloat16, reason=(
        f"MODEL.FCOS.INFERENCE_BACKEND auto: eager bfloat16 ({units}; {_work(expected_images)}"
        f": a compile gains only 8-13% an image, and pays from {needed} images this large)"))


def choose_backend(requested: str, device_type: str, expected_images: Optional[int] = None,
                   *, warm: bool = False, pixels: Optional[int] = None,
                   capabilities: Optional[Mapping[str, bool]] = None,
                   environ: Optional[Mapping[str, str]] = None) -> BackendChoice:
    """What runs for ``MODEL.FCOS.INFERENCE_BACKEND`` ``requested`` (see the module docstring).

    Args:
        device_type: the model's device ("cpu", "cuda", ...).
        expected_images: images the call has ahead; None: unknown (a model kept to serve).
        warm: this machine's compile cache already holds the model (``compile_cache``).
        pixels: height x width of the padded input batch; None: unknown (counted as small).
        capabilities: :func:`cpu_capabilities`'s answer; default this CPU's.
        environ: where ``FCOS_D2_AUTO_BACKEND`` is read; default ``os.environ``.
    """
    check_inference_backend(requested)
    if requested != "auto":
        return _explicit(requested, device_type)
    pinned = (os.environ if environ is None else environ).get(AUTO_OVERRIDE_ENV)
    if pinned:
        if pinned not in INFERENCE_BACKENDS[1:]:
            raise ValueError(f"{AUTO_OVERRIDE_ENV}: unknown '{pinned}', expected one of "
                             f"{INFERENCE_BACKENDS[1:]}")
        return dataclasses.replace(_explicit(pinned, device_type), reason=(
            f"MODEL.FCOS.INFERENCE_BACKEND auto: {pinned} ({AUTO_OVERRIDE_ENV} in the "
            "environment)"))
    if device_type == "cuda":
        return BackendChoice("eager", torch.float16, reason=(
            "MODEL.FCOS.INFERENCE_BACKEND auto: eager float16 autocast (a GPU; the compiled "
            "backends are CPU paths)"))
    if device_type != "cpu":
        return BackendChoice("eager", reason=f"MODEL.FCOS.INFERENCE_BACKEND auto: eager "
                                             f"(the model is on {device_type})")
    capabilities = cpu_capabilities() if capabilities is None else capabilities
    if capabilities["native_bf16"]:
        return _on_native_bf16(expected_images, warm, bool(capabilities.get("amx")), pixels)
    return BackendChoice("eager", torch.float32, warning=True, reason=(
        "MODEL.FCOS.INFERENCE_BACKEND auto: eager float32, since this CPU has no native bf16 "
        "(neither AVX512-BF16 nor AMX): bf16 would be emulated, slower than float32"))
