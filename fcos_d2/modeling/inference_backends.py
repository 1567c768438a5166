"""How the backbone and head run at inference on the CPU (``MODEL.FCOS.INFERENCE_BACKEND``).

- "eager": PyTorch eager mode, as trained (float32, or ``INFERENCE_DTYPE`` under autocast).
- "bf16_compiled": ``torch.compile`` (inductor) with freezing, under bf16 autocast: the
  weights become constants of the graph, converted to bf16 and prepacked for oneDNN once.
- "int8_pt2e": static int8 through PyTorch's own x86 path (PT2E, from ``torchao``):
  ``torch.export`` of backbone and head, the ``X86InductorQuantizer`` (int8 weights per
  output channel, uint8 activations per tensor), calibrated on the first
  ``INT8_CALIBRATION_BATCHES`` batches the model sees (those run in float32 while the
  observers record their ranges), then ``convert_pt2e`` and ``torch.compile`` with freezing
  (oneDNN's int8 kernels: AMX or VNNI).
- "auto": "bf16_compiled" where the CPU has native bf16 (AVX512-BF16/AMX; measured faster
  than int8_pt2e on such a CPU, docs/speed.md), else "int8_pt2e" where it has VNNI int8
  units, else "eager" in float32, saying why in one log line. Off the CPU, every backend
  runs "eager" (one log line).

Decoding, thresholds, top-k and NMS stay in float32 eager mode in every backend. The
compiled form is built on the first call (compiling takes seconds for a tiny model,
minutes for an R-50) and rebuilt when the model's weights change. Input sizes may vary:
each new padded input shape exports and compiles its own int8 graph (with the calibrated
ranges); the bf16 graph recompiles once, then runs with dynamic shapes (torch.compile's
default).

Symbols: N images, H x W the padded batch, L levels.
"""
import functools
from typing import Callable, Dict, List, Optional, Tuple

import torch
from detectron2.structures import ImageList
from torch import Tensor, nn

from ..precision import cpu_has_native_bf16

__all__ = ["INFERENCE_BACKENDS", "INT8_CALIBRATION_BATCHES", "BackendRunner",
           "check_inference_backend", "cpu_capabilities", "resolve_inference_backend"]

INFERENCE_BACKENDS = ("eager", "bf16_compiled", "int8_pt2e", "auto")
# Batches that calibrate the int8 ranges before the model is converted.
INT8_CALIBRATION_BATCHES = 4
# torch.cpu.get_capabilities() keys of the int8 dot-product units oneDNN uses.
NATIVE_INT8_CAPABILITIES = ("amx_int8", "avx512_vnni", "avx_vnni")


def check_inference_backend(backend: str) -> str:
    """``backend`` if it is one of ``INFERENCE_BACKENDS``, else a ValueError naming the key."""
    if backend not in INFERENCE_BACKENDS:
        raise ValueError(f"MODEL.FCOS.INFERENCE_BACKEND: unknown '{backend}', expected one of "
                         f"{INFERENCE_BACKENDS}")
    return backend


@functools.lru_cache(maxsize=None)
def cpu_capabilities() -> Dict[str, bool]:
    """{"native_int8": AMX-INT8 or VNNI, "native_bf16": AVX512-BF16/AMX-BF16} of this CPU."""
    probe = getattr(torch.cpu, "get_capabilities", None)
    found = probe() if probe is not None else {}
    return {"native_int8": any(bool(found.get(k)) for k in NATIVE_INT8_CAPABILITIES),
            "native_bf16": bool(cpu_has_native_bf16())}


def torchao_available() -> bool:
    """Whether ``torchao`` (PT2E quantization's home since torch 2.10) is installed."""
    try:
        import torchao.quantization.pt2e  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_inference_backend(backend: str, device_type: str) -> Tuple[str, str]:
    """The backend to run on ``device_type`` and, where it falls back to "eager", the one
    log line saying why ("" otherwise). Explicit CPU backends are returned as asked on a CPU,
    whatever its instructions (emulated bf16 or int8 is slow, not wrong)."""
    check_inference_backend(backend)
    if backend != "eager" and device_type != "cpu":
        return "eager", (f"MODEL.FCOS.INFERENCE_BACKEND {backend}: the model is on "
                         f"{device_type}, the compiled backends are CPU paths: running eager")
    if backend != "auto":
        return backend, ""
    capabilities = cpu_capabilities()
    if capabilities["native_bf16"]:
        return "bf16_compiled", ""
    if capabilities["native_int8"] and torchao_available():
        return "int8_pt2e", ""
    return "eager", ("MODEL.FCOS.INFERENCE_BACKEND auto: this CPU has neither int8 dot-product "
                     "units (AMX-INT8/VNNI, or torchao is missing) nor native bf16 "
                     "(AVX512-BF16/AMX): running eager float32")


class _ForwardHead(nn.Module):
    """``model.forward_head`` as a function of the padded batch (N, 3, H, W) alone."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tensor: Tensor):
        sizes = [(tensor.shape[-2], tensor.shape[-1])] * tensor.shape[0]
        return tuple(self.model.forward_head(ImageList(tensor, sizes)))


def _to_float(outputs):
    """Every tensor of the (nested) outputs in float32."""
    if isinstance(outputs, Tensor):
        return outputs.float()
    return type(outputs)(_to_float(o) for o in outputs)


def _one_partition_per_conv(graph: torch.fx.Graph) -> None:
    """Gives every conv call of an exported graph its own source: a module called at several
    levels (the shared head) would otherwise be one partition with several outputs, which
    the x86 quantizer refuses ("conv partition has more than one output node")."""
    for node in graph.nodes:
        if node.op == "call_function" and node.target == torch.ops.aten.conv2d.default:
            node.meta["source_fn_stack"] = [(node.name, torch.nn.functional.conv2d)]


def _int8_prepared(module: nn.Module, example: Tensor) -> nn.Module:
    """``module`` exported at ``example``'s shape, annotated by the x86 quantizer, with
    observers in place (torchao's PT2E)."""
    try:
        from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
    except ImportError as error:
        raise RuntimeError("MODEL.FCOS.INFERENCE_BACKEND int8_pt2e: PT2E quantization moved "
                           "from torch.ao to torchao in this torch; pip install torchao "
                           f"({error})") from error
    graph = torch.export.export(module, (example,)).module()
    _one_partition_per_conv(graph.graph)
    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config())
    return prepare_pt2e(graph, quantizer)


def _int8_compiled(prepared: nn.Module) -> Callable:
    """The calibrated ``prepared`` graph converted to int8 and compiled with frozen weights."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e
    return _frozen(torch.compile(convert_pt2e(prepared)))


def _frozen(compiled: Callable) -> Callable:
    """``compiled`` called with inductor's freezing on (weights folded as constants), which
    must hold while it compiles, i.e. at its calls."""
    def call(*args):
        with torch._inductor.config.patch(freezing=True):
            return compiled(*args)
    return call


class BackendRunner:
    """Runs ``model.forward_head`` through a compiled backend ("bf16_compiled" or
    "int8_pt2e"; see the module docstring), built on first use and rebuilt when the
    model's weights change. Held by the model as a plain attribute: not in its
    ``state_dict``; deep copies and pickles hold an empty one of the same backend."""

    def __init__(self, backend: str):
        if backend not in ("bf16_compiled", "int8_pt2e"):
            raise ValueError(f"BackendRunner: '{backend}' is no compiled backend")
        self.backend = backend
        self.clear()

    def __deepcopy__(self, memo) -> "BackendRunner":
        return BackendRunner(self.backend)

    def __getstate__(self) -> dict:
        return {"backend": self.backend}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["backend"])

    def clear(self) -> None:
        """Drops the compiled forms and the calibration; the next call builds them again."""
        self._bf16: Optional[Callable] = None
        self._int8: Dict[tuple, Callable] = {}  # per input shape (N, 3, H, W)
        self._prepared: Optional[nn.Module] = None
        self._ranges: Optional[dict] = None  # the calibrated observers' state
        self._calibrated = 0
        self._signature: Optional[tuple] = None

    @torch.no_grad()
    def __call__(self, model: nn.Module, images: ImageList) -> List:
        """``model.forward_head(images)`` through the backend: per-level outputs in float32."""
        from .fast_inference import weights_signature  # fast_inference imports this module
        signature = weights_signature(model)
        if signature != self._signature:
            self.clear()
            self._signature = signature
        tensor = images.tensor  # (N, 3, H, W)
        if self.backend == "bf16_compiled":
            if self._bf16 is None:
                self._bf16 = _frozen(torch.compile(_ForwardHead(model)))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return list(_to_float(self._bf16(tensor)))
        return list(self._run_int8(model, tensor))

    def _run_int8(self, model: nn.Module, tensor: Tensor):
        """The first ``INT8_CALIBRATION_BATCHES`` batches calibrate (their outputs are
        float32); then each input shape gets its graph, exported and converted with those
        ranges, and compiled once (torch.export graphs are shape-specialised)."""
        shape = tuple(tensor.shape)
        if self._ranges is None:
            if self._prepared is None:
                self._prepared = _int8_prepared(_ForwardHead(model), tensor)
            outputs = self._prepared(tensor)
            self._calibrated += 1
            if self._calibrated < INT8_CALIBRATION_BATCHES:
                return outputs
            self._ranges = self._prepared.state_dict()
            self._int8[shape] = _int8_compiled(self._prepared)
            self._prepared = None
            return outputs
        if shape not in self._int8:
            prepared = _int8_prepared(_ForwardHead(model), tensor)
            prepared.load_state_dict(self._ranges)  # same graph, same observer names
            self._int8[shape] = _int8_compiled(prepared)
        return self._int8[shape](tensor)
