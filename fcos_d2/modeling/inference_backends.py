"""How the backbone and head run at inference on the CPU (``MODEL.FCOS.INFERENCE_BACKEND``).

- "eager": PyTorch eager mode, as trained (float32, or ``INFERENCE_DTYPE`` under autocast).
- "bf16_compiled": ``torch.compile`` (inductor) under bf16 autocast. With the model's
  ``compile_freeze`` (``COMPILE_FREEZE_WEIGHTS``, default) inductor's freezing makes the
  weights constants of the graph, converted to bf16 and prepacked for oneDNN once; without,
  they are inputs of the graph, so new weights need no recompile and inductor's FX graph
  cache serves the next process, at a cost per call (docs/speed.md).
- "int8_pt2e": static int8 through PyTorch's own x86 path (PT2E, from ``torchao``):
  ``torch.export`` of backbone and head, the ``X86InductorQuantizer`` (int8 weights per
  output channel, uint8 activations per tensor), calibrated on the first
  ``INT8_CALIBRATION_BATCHES`` batches the model sees (those run in float32 while the
  observers record their ranges), then ``convert_pt2e`` and ``torch.compile`` with freezing
  (oneDNN's int8 kernels: AMX or VNNI).
- "auto" (the default): one of these, or eager under autocast, chosen from the device and
  the work ahead (``backend_choice.py``), said in one log line.

Decoding, thresholds, top-k and NMS stay in float32 eager mode in every backend. The
compiled form is built on the first call at each input size (seconds for a tiny model,
minutes for an R-50; a log line gives the expected time) and kept in the compile cache
(``compile_cache.py``), so that the next process on the machine reuses it: all of it with
weights as inputs, the compiled C++ kernels with frozen weights (which, changed, compile
again). Its input is padded up to a bucketed size (``INFERENCE_SIZE_BUCKETS``)
and its outputs cropped back, so that mixed sizes compile a few graphs. int8 folds its
weights as constants: each new padded input shape exports and compiles its own int8 graph
(with the calibrated ranges), and new weights calibrate and compile again.

Symbols: N images, H x W the padded batch, L levels.
"""
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from detectron2.structures import ImageList
from torch import Tensor, nn
from torch.nn import functional as F

from . import compile_cache
from .backend_choice import INFERENCE_BACKENDS, check_inference_backend, cpu_capabilities

__all__ = ["INFERENCE_BACKENDS", "INT8_CALIBRATION_BATCHES", "BackendRunner",
           "check_inference_backend", "cpu_capabilities"]

# Batches that calibrate the int8 ranges before the model is converted.
INT8_CALIBRATION_BATCHES = 4
# Compiled graphs per code object before dynamo gives up (one per bucketed size).
RECOMPILE_LIMIT = 64


def torchao_available() -> bool:
    """Whether ``torchao`` (PT2E quantization's home since torch 2.10) is installed."""
    try:
        import torchao.quantization.pt2e  # noqa: F401
    except ImportError:
        return False
    return True


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


def crop_levels(outputs: Sequence[List[Tensor]], height: int, width: int,
                strides: Sequence[int]) -> List[List[Tensor]]:
    """Each level's (N, C, Hi', Wi') output of a bucketed batch cut to the (N, C, Hi, Wi) it
    has for a batch of ``height`` x ``width``: Hi = ceil(H / stride), the top-left part (a
    stride-s layer's output at row i sees input rows from s * i on)."""
    return [[x[..., : math.ceil(height / s), : math.ceil(width / s)] for x, s in
             zip(per_level, strides)] for per_level in outputs]


class BackendRunner:
    """Runs ``model.forward_head`` through a compiled backend ("bf16_compiled" or
    "int8_pt2e"; see the module docstring), built on first use at each input size. Held by
    the model as a plain attribute: not in its ``state_dict``; deep copies and pickles hold
    an empty one of the same backend. The model's ``compile_cache_dir`` and
    ``size_buckets`` settings say where the compiles are cached and how sizes are
    bucketed."""

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
        self.compiled_sizes: Dict[tuple, float] = {}  # bf16: (N, 3, H, W) -> compile seconds
        self._int8: Dict[tuple, Callable] = {}  # per input shape (N, 3, H, W)
        self._prepared: Optional[nn.Module] = None
        self._ranges: Optional[dict] = None  # the calibrated observers' state
        self._calibrated = 0
        self._signature: Optional[tuple] = None

    @torch.no_grad()
    def __call__(self, model: nn.Module, images: ImageList) -> List:
        """``model.forward_head(images)`` through the backend: per-level outputs in float32."""
        freeze = self.backend == "int8_pt2e" or getattr(model, "compile_freeze", True)
        if freeze:  # the weights are constants of the graph: new ones need a new graph
            from .fast_inference import weights_signature  # fast_inference imports this module
            signature = weights_signature(model)
            if signature != self._signature:
                self.clear()
                self._signature = signature
        if self.backend == "bf16_compiled":
            return self._run_bf16(model, images.tensor, freeze)
        return list(self._run_int8(model, images.tensor))

    def _run_bf16(self, model: nn.Module, tensor: Tensor, freeze: bool) -> List:
        """The (N, 3, H, W) batch, padded with zeros to its bucket where that is the graph to
        run (``compile_cache.graph_shape``), through the graph compiled for that size
        (compiled and cached on its first call), cropped back."""
        height, width = tensor.shape[-2:]
        strides = getattr(model, "strides", None)
        shape = tuple(tensor.shape) if strides is None else \
            self._graph_shape(model, tuple(tensor.shape))
        if shape[-2:] != (height, width):
            memory_format = (torch.channels_last if tensor.is_contiguous(
                memory_format=torch.channels_last) else torch.contiguous_format)
            tensor = F.pad(tensor, (0, shape[-1] - width, 0, shape[-2] - height))
            tensor = tensor.contiguous(memory_format=memory_format)
        if self._bf16 is None:
            compiled = torch.compile(_ForwardHead(model), dynamic=False)
            self._bf16 = _frozen(compiled) if freeze else compiled
        shape = tuple(tensor.shape)
        with torch.autocast("cpu", dtype=torch.bfloat16), \
                torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            if shape in self.compiled_sizes:
                outputs = self._bf16(tensor)
            else:
                outputs = self._compile_bf16(model, tensor)
        outputs = _to_float(outputs)
        return outputs if strides is None else crop_levels(outputs, height, width, strides)

    def _graph_shape(self, model: nn.Module, exact: Tuple[int, ...]) -> Tuple[int, ...]:
        """The (N, 3, H', W') graph input for a batch of shape ``exact``."""
        if exact in self.compiled_sizes:
            return exact
        multiple = getattr(getattr(model, "backbone", None), "size_divisibility", 0) or 32
        bucket = exact[:2] + compile_cache.bucketed_size(*exact[2:], multiple,
                                                         getattr(model, "size_buckets", 0))
        root = compile_cache.cache_root(getattr(model, "compile_cache_dir", ""))
        cached = compile_cache.cached_shapes(root, compile_cache.model_key(model, self.backend))
        return compile_cache.graph_shape(exact, bucket, self.compiled_sizes, cached)

    def _compile_bf16(self, model: nn.Module, tensor: Tensor):
        """The first call at ``tensor``'s shape: compiles (or loads from the cache), saying
        how long it should take and took, and records the time in the cache's index."""
        root = compile_cache.cache_root(getattr(model, "compile_cache_dir", ""))
        folder = compile_cache.activate_cache(root)
        key, shape = compile_cache.model_key(model, self.backend), tuple(tensor.shape)
        start = compile_cache.log_compile_start(
            shape, compile_cache.compile_estimate(root, key, shape, model), folder)
        hits, misses = compile_cache.inductor_cache_counts()
        outputs = self._bf16(tensor)
        now_hits, now_misses = compile_cache.inductor_cache_counts()
        seconds = compile_cache.log_compile_end(start, now_hits - hits, now_misses - misses)
        self.compiled_sizes[shape] = seconds
        compile_cache.record_compile(root, key, shape, seconds)
        return outputs

    def _run_int8(self, model: nn.Module, tensor: Tensor):
        """The first ``INT8_CALIBRATION_BATCHES`` batches calibrate (their outputs are
        float32); then each input shape gets its graph, exported and converted with those
        ranges, and compiled once (torch.export graphs are shape-specialised)."""
        shape = tuple(tensor.shape)
        if shape not in self._int8:  # a compile may come: into the compile cache
            compile_cache.activate_cache(compile_cache.cache_root(
                getattr(model, "compile_cache_dir", "")))
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
