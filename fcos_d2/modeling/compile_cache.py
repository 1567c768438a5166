"""A compile paid once per machine and Python environment: where inductor's caches live,
which models they hold, how long a compile takes, and the padded sizes that share a
compiled graph.

- The cache folder (``MODEL.FCOS.COMPILE_CACHE_DIR``; empty: ``$FCOS_D2_CACHE_DIR``, else
  ``~/.cache/fcos_d2``) holds inductor's FX graph and AOT autograd caches in ``inductor/``
  (``TORCHINDUCTOR_CACHE_DIR``, unless the user set that variable) and ``compiles.json``:
  per model structure (parameter names, shapes and dtypes; not their values), the seconds
  each input shape took to compile. A second process compiling the same structure finds
  inductor's cache and compiles nothing; "auto" reads ``compiles.json`` to know it will.
  Inductor keys its FX graphs by content (graph, CPU, torch version), but its compiled C++
  kernels by the compiler's command line, which names torch's install folder: another
  Python environment (a second clone's ``.venv``) finds the graphs and compiles the kernels
  again (``tests/engine/test_compile.py``: 47 s against 4 s warm). So the model's key names
  that folder, and a warm compile is one of the same environment.
- Sizes are bucketed: after a process's first input size, a new size runs padded up to its
  bucket, each side rounded up to a ladder of ``steps`` sizes per octave (multiples of the
  backbone's size divisibility), so that a dataset whose images vary in size compiles a few
  graphs, while a model serving one size runs it unpadded (``graph_shape``).

Symbols: H x W the padded batch.
"""
import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Collection, Dict, Set, Tuple

import torch
from torch import nn

__all__ = ["CACHE_ENV", "activate_cache", "bucket_side", "bucketed_size", "cache_root",
           "cached_shapes", "compile_estimate", "graph_shape", "is_warm", "model_key",
           "record_compile", "torch_folder"]

logger = logging.getLogger(__name__)
CACHE_ENV = "FCOS_D2_CACHE_DIR"
INDEX = "compiles.json"
# A first compile's seconds per convolution, before this machine has timed one: the tiny
# test model (33 convolutions) took about 30 s on one thread (docs/speed.md).
COLD_SECONDS_PER_CONV = 1.0
# The inductor folder this module set, told apart from one the user set.
_ACTIVATED: Dict[str, str] = {}


def cache_root(configured: str = "") -> Path:
    """The cache folder: ``configured`` (MODEL.FCOS.COMPILE_CACHE_DIR), else
    ``$FCOS_D2_CACHE_DIR``, else ``~/.cache/fcos_d2``."""
    folder = configured or os.environ.get(CACHE_ENV) or "~/.cache/fcos_d2"
    return Path(folder).expanduser().resolve()


def activate_cache(root: Path) -> Path:
    """Points inductor's caches at ``root``/inductor, unless the user set
    ``TORCHINDUCTOR_CACHE_DIR`` to a folder of their own; returns the folder in use."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    wanted = str(root / "inductor")
    ours = (os.path.abspath(default_cache_dir()), _ACTIVATED.get("folder"))
    if current and os.path.abspath(current) not in ours:
        return Path(current)
    if current != wanted:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = _ACTIVATED["folder"] = wanted
        from torch._inductor.utils import clear_caches
        clear_caches()  # in-process caches keyed by the old folder
    return Path(wanted)


def torch_folder() -> str:
    """Where torch is installed: inductor's C++ compile command includes its headers from
    there, so kernels compiled in one environment are compiled again in another."""
    return os.path.dirname(os.path.abspath(torch.__file__))


def model_key(model: nn.Module, backend: str) -> str:
    """The model's structure (class, parameter and buffer names, shapes and dtypes), the
    backend and whether it freezes the weights, torch's version and install folder and the
    CPU's kind, hashed: what a cached compile depends on beyond the input shape. Weight
    values are not in it: inductor's cache keys on their shapes alone."""
    from .backend_choice import cpu_capabilities
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    parts = [type(model).__name__, backend, getattr(model, "compile_freeze", True),
             torch.__version__, torch_folder(), sorted(cpu_capabilities().items())]
    parts += [(name, tuple(t.shape), str(t.dtype)) for name, t in tensors]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _read_index(root: Path) -> Dict[str, Dict[str, float]]:
    try:
        return json.loads((root / INDEX).read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: everything is cold


def is_warm(root: Path, key: str) -> bool:
    """Whether a compile of the model ``key`` was recorded in ``root``."""
    return bool(_read_index(root).get(key))


def record_compile(root: Path, key: str, shape: Tuple[int, ...], seconds: float) -> None:
    """Notes in ``root``/compiles.json that ``key`` compiled at ``shape`` in ``seconds``
    (written atomically: several processes may share the folder)."""
    index = _read_index(root)
    index.setdefault(key, {})["x".join(map(str, shape))] = round(seconds, 1)
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f"{INDEX}.{os.getpid()}.tmp"
    partial.write_text(json.dumps(index, indent=1, sort_keys=True))
    os.replace(partial, root / INDEX)


def compile_estimate(root: Path, key: str, shape: Tuple[int, ...], model: nn.Module
                     ) -> Tuple[float, str]:
    """(seconds, where the figure comes from) that compiling ``model`` at ``shape`` should
    take: this machine's last time for that shape, else for another shape of the model
    (inductor compiles a new shape again), else a first guess from the convolution count."""
    times = _read_index(root).get(key, {})
    name = "x".join(map(str, shape))
    if name in times:
        return times[name], "its last compile at this size on this machine, now cached"
    if times:
        return max(times.values()), "its compile at another size on this machine"
    convs = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    return convs * COLD_SECONDS_PER_CONV, f"a first guess for {convs} convolutions"


def bucket_side(side: int, multiple: int, steps: int) -> int:
    """The smallest size of the ladder at least ``side``: multiples of ``multiple``, ``steps``
    per octave (each at most 1 + 1/steps times the one below); ``steps`` 0: ``side``
    rounded up to ``multiple``."""
    multiple = max(1, multiple)
    units = math.ceil(side / multiple)
    if steps <= 0:
        return units * multiple
    octave = 1  # the ladder's step where ``units`` falls: sizes steps*octave .. 2*steps*octave
    while steps * octave * 2 <= units:
        octave *= 2
    return math.ceil(units / octave) * octave * multiple


def bucketed_size(height: int, width: int, multiple: int, steps: int) -> Tuple[int, int]:
    """(H, W) of the bucket of a batch padded to ``height`` x ``width``."""
    return bucket_side(height, multiple, steps), bucket_side(width, multiple, steps)


def cached_shapes(root: Path, key: str) -> Set[Tuple[int, ...]]:
    """The input shapes at which the model ``key`` was compiled on this machine."""
    return {tuple(int(x) for x in name.split("x")) for name in _read_index(root).get(key, {})}


def graph_shape(exact: Tuple[int, ...], bucket: Tuple[int, ...],
                compiled_here: Collection[Tuple[int, ...]],
                cached: Collection[Tuple[int, ...]]) -> Tuple[int, ...]:
    """The input shape of the graph to run a batch of shape ``exact`` in: one compiled in
    this process, else one cached on the machine (the exact shape first, then its bucket);
    else the exact shape for the first shape of the process (a model that serves one size
    pays no padding), the bucket after it (mixed sizes compile few graphs)."""
    for shapes in (compiled_here, cached):
        for shape in (exact, bucket):
            if shape in shapes:
                return shape
    return bucket if compiled_here else exact


def log_compile_start(shape: Tuple[int, ...], estimate: Tuple[float, str], folder: Path
                      ) -> float:
    """Says that a compile starts and how long it should take; returns the start time."""
    seconds, source = estimate
    logger.info(f"Compiling backbone and head for input {'x'.join(map(str, shape))} "
                f"(torch.compile, bf16): expect about {seconds:.0f} s ({source}); cached in "
                f"{folder} for the next runs")
    return time.perf_counter()


def log_compile_end(start: float, hits: int, misses: int) -> float:
    """Says how long the compile took and whether inductor's cache served it."""
    seconds = time.perf_counter() - start
    how = "loaded from the cache" if hits and not misses else "compiled"
    logger.info(f"Backbone and head {how} in {seconds:.1f} s (inductor cache: {hits} hits, "
                f"{misses} misses)")
    return seconds


def inductor_cache_counts() -> Tuple[int, int]:
    """(hits, misses) of inductor's FX graph cache in this process so far."""
    from torch._dynamo.utils import counters
    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]

