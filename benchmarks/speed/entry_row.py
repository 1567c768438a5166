"""The entry row of ``python -m benchmarks.speed`` (only when ``--rows entry`` names it: it
takes minutes): the default inference backend (``MODEL.FCOS.INFERENCE_BACKEND auto``) as its
entry points run it, R-50 FCOS (configs/FCOS-R50.yaml, random weights seeded 0) on
``--entry-images`` images of ``--entry-size`` (default 800x1216; ``--quick`` 512x768)
against torchvision's fp32 FCOS looping over the same images, in one run. In this order:

1. torchvision fp32: the loop over the images after one warm-up image (seconds, and the
   median per image); torch threads ``--threads``;
2. ``train_net.py --eval-only`` on them, the whole command's wall time, with a fresh (cold)
   compile cache folder (``MODEL.FCOS.COMPILE_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR``);
3. ``DefaultPredictor(cfg)`` in this process: the median per image after one warm-up call
   (a model kept to serve: where auto compiles, the compile fills the cache folder);
4. the same ``--eval-only`` command again, now with the cache of 2 and 3 (warm);
5. a fresh process's ``DefaultPredictor(cfg)`` with that cache: its first call against
   the median of the 5 after it (``entry_predictor``).

Every run's log gives what auto chose (its one line) and, where it compiled, the seconds
of the compile or of the load from the cache. Subprocesses run with ``OMP_NUM_THREADS`` set
to ``--threads``, the environment otherwise as given (``FCOS_D2_AUTO_BACKEND`` pins auto).
"""
import os
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from benchmarks.speed import entry_data, entry_predictor as ep, entry_runs as runs
from benchmarks.speed.timing import bf16_kind

ROW, FRESH_CALLS = "entry", 5


def entry_size(args) -> Tuple[int, int]:
    if args.entry_size:
        return tuple(int(x) for x in args.entry_size.split("x"))
    return (512, 768) if args.quick else (800, 1216)


def entry_targets(s: Dict[str, float], images: int, size: Tuple[int, int]) -> Dict[str, float]:
    """The issue's ratios from the row's seconds (``s``: tv_loop, tv_median, eval_cold,
    eval_warm, eval_warm_compile, predictor_median, fresh_first, fresh_steady)."""
    at = f"R-50 {'x'.join(map(str, size))}, {images} images"
    return {
        f"entry: --eval-only cold cache wall / torchvision fp32 loop ({at}; target <= 0.3)":
            s["eval_cold"] / s["tv_loop"],
        f"entry: --eval-only warm cache wall / torchvision fp32 loop ({at})":
            s["eval_warm"] / s["tv_loop"],
        f"entry: --eval-only warm cache, compile or load seconds ({at}; target <= 15)":
            s["eval_warm_compile"],
        f"entry: DefaultPredictor median / torchvision fp32 median per image ({at}; "
        "target <= 0.15)": s["predictor_median"] / s["tv_median"],
        f"entry: fresh process, warm cache, DefaultPredictor first call / steady state "
        f"({at}; target <= 3)": s["fresh_first"] / s["fresh_steady"]}


def measure(images: int, size: Tuple[int, int], threads: int, folder: Path) -> dict:
    """The row's seconds (keys of ``entry_targets``) and parsed logs, inputs under ``folder``."""
    data = entry_data.write_dataset(folder / "data", images, *size)
    paths = sorted(data[1].glob("*.jpg"))
    cache, weights = folder / "cache", str(folder / "model.pth")
    overrides = ep.shared_overrides(weights, str(cache), size)
    entry_data.write_checkpoint(Path(weights), ep.fcos_cfg(overrides))
    env = runs.subprocess_env(threads, cache)

    def eval_only(output: str) -> Tuple[float, dict]:
        wall, text = runs.timed_run(runs.eval_only_command(data, overrides, folder / output), env)
        return wall, runs.parse_log(text)

    s, logs = {}, {}
    s["tv_loop"], s["tv_median"] = runs.torchvision_loop(paths, size)
    s["eval_cold"], logs["eval_cold"] = eval_only("cold")
    s["predictor_median"], logs["predictor"] = runs.predictor_in_process(paths, overrides, cache)
    s["eval_warm"], logs["eval_warm"] = eval_only("warm")
    s["eval_warm_compile"] = logs["eval_warm"]["compile_s"]
    fresh, logs["fresh"] = runs.fresh_predictor(weights, cache, size, paths, FRESH_CALLS, env)
    s.update({"fresh_" + key[:-2]: value for key, value in fresh.items()})  # build, first, steady
    return {"seconds": s, "logs": logs}


def row(args, measured: Optional[dict] = None) -> List[dict]:
    """The row's one record; ``measured``: ``measure``'s answer (tests), else measured now."""
    size, images = entry_size(args), args.entry_images
    print(f"\n[{ROW}: INFERENCE_BACKEND auto through its entry points, R-50 FCOS, "
          f"{'x'.join(map(str, size))}, {images} images, threads {args.threads}]")
    if args.device != "cpu":
        print("  skipped: the entry row measures the CPU's default backend")
        return [{"row": ROW, "skipped": "the entry row measures the CPU's default backend"}]
    if measured is None:
        with tempfile.TemporaryDirectory(prefix="fcos_d2_entry_") as folder:
            measured = measure(images, size, args.threads, Path(folder))
    from fcos_d2.modeling.backend_choice import AUTO_OVERRIDE_ENV, cpu_capabilities

    s, logs = measured["seconds"], measured["logs"]
    record = {"row": ROW, "image_size": list(size), "images": images, "threads": args.threads,
              "bf16": bf16_kind("cpu"), "cpu_capabilities": cpu_capabilities(),
              "auto_pinned": os.environ.get(AUTO_OVERRIDE_ENV, ""),
              "raw_seconds": {k: round(v, 4) for k, v in s.items()},
              "auto_choice": {k: log["auto"] for k, log in logs.items()},
              "compiles": {k: log["compiles"] for k, log in logs.items()},
              "targets": entry_targets(s, images, size)}
    for line in describe(s, logs):
        print(line)
    return [record]


def describe(s: Dict[str, float], logs: Dict[str, dict]) -> List[str]:
    """The printed table: one line per measurement, with what auto chose."""
    def compiled(name: str) -> str:
        found = logs[name]["compiles"]
        return ", ".join(f"{how} in {sec:.1f} s" for how, sec in found) or "no compile"

    return [f"  {'torchvision fp32 loop':34s} {s['tv_loop']:8.2f} s   median "
            f"{s['tv_median']:.3f} s/image",
            *(f"  {f'--eval-only, {name} cache':34s} {s['eval_' + name]:8.2f} s   "
              f"{s['eval_' + name] / s['tv_loop']:.3f}x the loop   {compiled('eval_' + name)}"
              for name in ("cold", "warm")),
            f"  {'DefaultPredictor, steady state':34s} {s['predictor_median']:8.3f} s/image   "
            f"{s['predictor_median'] / s['tv_median']:.3f}x torchvision's median   "
            f"{compiled('predictor')}",
            f"  {'fresh process: first / steady':34s} {s['fresh_first']:8.3f} / "
            f"{s['fresh_steady']:.3f} s = {s['fresh_first'] / s['fresh_steady']:.2f}x   "
            f"{compiled('fresh')}",
            *(f"  auto, {name}: {log['auto'] or '(no line)'}" for name, log in logs.items())]
