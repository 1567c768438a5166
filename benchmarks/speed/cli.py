"""Side-by-side benchmark of the whole R-50 FCOS: fcos-d2 against torchvision's FCOS and
detectron2's built-in FCOS, in one process, same thread count, contenders interleaved
(one timing of each in turn, so that load from other processes hits all of them alike),
median of the timings after a warm-up. Prints a table per row and writes a JSON file.

Rows (``--rows``, comma-separated; default all):
  inference  latency per image at batch 1 and throughput at batch 4, 800x1216, float32 and
             bf16 (CPU; fp16 AMP with --device cuda); fcos-d2 as configs/FCOS-R50.yaml,
             also with MODEL.FCOS.CHANNELS_LAST
  training   one iteration (forward, backward, SGD step), batch 2, 800x1216, 20 boxes each
  flops      backbone + head MACs (fvcore) and the achieved fraction of this machine's peak,
             the rate of a large 3x3 convolution timed in the same run
  memory     peak RSS (CUDA: peak allocated) of one inference and one training iteration,
             each contender in a fresh subprocess so that the peaks are its own
  parts      training targets + losses, and post-processing, against torchvision's
  onnx       the whole detector in onnxruntime, fp32 and int8, against PyTorch eager
  compile    torch.compile (inductor) of backbone + head against eager: inference and a
             training step, compile time, output difference
  loader     images/s of one loader worker: FCOSDatasetMapper against detectron2's
             DatasetMapper on 800x1333 JPEGs with the COCO augmentations
  labelenc   the plain FCOS that LabelEnc's step 2 leaves (LEF and adapter stripped, loaded
             strictly) against plain FCOS-R50: latency, parameters, MACs

Adding a row: one function ``row_<name>(args) -> List[dict]`` that prints its table and
returns its results, and an entry in ``ROWS``.

Usage: python tools/benchmark.py [--rows inference,training] [--repeats 3] [--quick]
       [--device cpu|cuda] [--threads N] [--json output/benchmark.json]
"""
import argparse
import contextlib
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import fcos_d2  # noqa: E402,F401  (before detectron2)
from fcos_d2.engine.amp import cpu_has_native_bf16  # noqa: E402
import benchmark_contenders as bc  # noqa: E402
import benchmark_parts  # noqa: E402


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
    """One line per result; ``ratio`` is its time over the ``baseline`` contender's."""
    print(f"\n[{title}]")
    base = {r["batch"]: r["seconds"] for r in results if r["contender"] == baseline}
    for r in results:
        r["ratio_to_" + baseline.replace(" ", "_")] = r["seconds"] / base[r["batch"]]
        print(f"  {r['contender']:32s} batch {r['batch']}  {r['seconds'] * 1e3:9.1f} ms/batch  "
              f"{r['seconds'] / r['batch'] * 1e3:9.1f} ms/image  "
              f"{r['batch'] / r['seconds']:6.2f} images/s  {r['seconds'] / base[r['batch']]:.2f}x")


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


def inference_contenders(device: str, image_size) -> Dict[str, Callable]:
    """name -> infer(images), models in eval mode. fcos-d2 as configured (the fast path of
    MODEL.FCOS.FAST_INFERENCE: folded BN, channels_last), as trained (FAST_INFERENCE
    False), and the low-precision rows: fcos-d2 with MODEL.FCOS.INFERENCE_DTYPE (forced to
    bf16 with CPU_BF16 "always", so that an emulated CPU shows what it costs) and
    torchvision under autocast."""
    low = "bfloat16" if device == "cpu" else "float16"
    fp32, plain, tv, low_fast, d2 = (
        bc.fcos_d2_inference_contender(device), bc.fcos_d2_inference_contender(
            device, FAST_INFERENCE=False), bc.torchvision_contender(device, image_size),
        bc.fcos_d2_inference_contender(device, INFERENCE_DTYPE=low, CPU_BF16="always"),
        bc.detectron2_fcos_contender(device))
    for contender in (tv, d2):
        contender.model.eval()
    return {
        "fcos-d2 fp32": fp32.infer,
        "fcos-d2 fp32 FAST_INFERENCE off": plain.infer,
        "torchvision fp32": tv.infer,
        d2.name + " fp32": d2.infer,
        f"fcos-d2 {low_tag(device)}": low_fast.infer,
        f"torchvision {low_tag(device)}": lambda images: autocast_call(device, tv.infer, images),
    }


def autocast_call(device: str, fn: Callable, *args):
    with autocast(device, True):
        return fn(*args)


def row_inference(args) -> List[dict]:
    torch.manual_seed(0)
    contenders = inference_contenders(args.device, size(args))
    results = []
    for batch in args.inference_batches:
        images = bc.random_images(batch, *size(args), args.device)
        with torch.no_grad():
            fns = {name: (lambda f=f: f(images)) for name, f in contenders.items()}
            medians = interleaved_medians(fns, args.repeats, args.device)
        results += [{"row": "inference", "contender": name, "batch": batch, "seconds": t,
                     "image_size": list(size(args))} for name, t in medians.items()]
    print_table(f"inference, R-50 FCOS, {'x'.join(map(str, size(args)))}, random weights",
                results, "torchvision fp32")
    return results


def training_step(contender: bc.Contender, device: str, low: bool) -> Callable[[], None]:
    """One SGD iteration of ``contender`` on a fixed batch, the forward under autocast when
    ``low`` (with a gradient scaler on CUDA, as detectron2's AMPTrainer)."""
    model = contender.model.train()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-4,
                                momentum=0.9)
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


def row_training(args) -> List[dict]:
    torch.manual_seed(0)
    tag = low_tag(args.device)
    images = bc.random_images(2, *size(args), args.device)
    targets = bc.random_targets(2, 20, *size(args), args.device)
    d2 = lambda **fcos: bc.fcos_d2_contender(args.device, **fcos)
    tv = lambda: bc.torchvision_contender(args.device, size(args))
    steps = {
        "fcos-d2 fp32": training_step(d2(), args.device, False),
        "fcos-d2 fp32 +CL": training_step(d2(CHANNELS_LAST=True), args.device, False),
        "torchvision fp32": training_step(tv(), args.device, False),
        f"fcos-d2 {tag} +CL": training_step(d2(CHANNELS_LAST=True, CPU_BF16="always"),
                                            args.device, True),
        f"torchvision {tag}": training_step(tv(), args.device, True),
    }
    fns = {name: (lambda s=s: s(images, targets)) for name, s in steps.items()}
    medians = interleaved_medians(fns, args.repeats, args.device)
    results = [{"row": "training", "contender": name, "batch": 2, "seconds": t, "boxes": 20,
                "image_size": list(size(args))} for name, t in medians.items()]
    print_table("training iteration (forward, backward, SGD step), 20 boxes per image",
                results, "torchvision fp32")
    return results


def row_flops(args) -> List[dict]:
    """MACs of fcos-d2's backbone + head (fvcore counts one multiply-add as one "flop"),
    their achieved rate, and the rate of a large 3x3 conv in the same run."""
    from fvcore.nn import FlopCountAnalysis

    contender = bc.fcos_d2_contender(args.device)
    contender.model.eval()
    images = bc.random_images(1, *size(args), args.device)
    conv = torch.nn.Conv2d(256, 256, 3, padding=1).to(args.device).eval()
    conv_input = torch.randn(1, 256, 200, 304, device=args.device)
    conv_nhwc = torch.nn.Conv2d(256, 256, 3, padding=1).to(args.device).eval().to(
        memory_format=torch.channels_last)
    nhwc_input = conv_input.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        macs = _backbone_head_macs(contender, images)
        conv_macs = FlopCountAnalysis(conv, conv_input).total()
        medians = interleaved_medians({"net": lambda: contender.backbone_head(images),
                                       "conv": lambda: conv(conv_input),
                                       "conv_nhwc": lambda: conv_nhwc(nhwc_input)},
                                      args.repeats, args.device)
    # The peak: the faster of the two layouts.
    peak = 2 * conv_macs / min(medians["conv"], medians["conv_nhwc"])
    t_net = medians["net"]
    result = {"row": "flops", "image_size": list(size(args)), "backbone_head_gmacs": macs / 1e9,
              "backbone_head_seconds": t_net, "achieved_gflops": 2 * macs / t_net / 1e9,
              "peak_gflops_3x3_conv": peak / 1e9, "fraction_of_peak": 2 * macs / t_net / peak,
              "floor_seconds": 2 * macs / peak}
    print(f"\n[flops, fp32, one {'x'.join(map(str, size(args)))} image]")
    print(f"  fcos-d2 backbone+head: {macs / 1e9:.1f} GMACs in {t_net:.2f} s = "
          f"{result['achieved_gflops']:.0f} GFLOP/s")
    print(f"  3x3 conv 256->256 at 200x304 (best of NCHW, NHWC): {peak / 1e9:.0f} GFLOP/s "
          f"-> fraction of peak {result['fraction_of_peak']:.2f}, "
          f"floor {result['floor_seconds']:.2f} s per image")
    return [result]


def _backbone_head_macs(contender: bc.Contender, images: torch.Tensor) -> float:
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


def row_memory(args) -> List[dict]:
    """Peak memory of each contender, one fresh subprocess per (contender, mode)."""
    results = []
    print("\n[peak memory" + (", RSS high-water mark of a fresh process]"
                             if args.device == "cpu" else ", CUDA max allocated]"))
    for name in bc.CONTENDERS:
        for mode in ("inference", "training"):
            command = [sys.executable, __file__, "--memory-probe", name, mode,
                       "--device", args.device, "--threads", str(args.threads)]
            if args.quick:
                command.append("--quick")
            probe = subprocess.run(command, capture_output=True, text=True)
            if probe.returncode != 0:
                print(f"  {name:12s} {mode:9s} failed: {probe.stderr.strip()[-300:]}")
                continue
            result = json.loads(probe.stdout.strip().splitlines()[-1])
            results.append(result)
            print(f"  {result['contender']:32s} {mode:9s} "
                  f"peak {result['peak_mib']:7.0f} MiB (after building: "
                  f"{result['built_mib']:.0f} MiB)")
    return results


def rss() -> float:
    """This process's RSS high-water mark in MiB: VmHWM, which starts afresh at exec
    (getrusage's ru_maxrss would carry over the parent's peak)."""
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024


def memory_probe(name: str, mode: str, args) -> None:
    """Runs in the subprocess: builds one contender, runs ``mode`` twice, prints JSON."""
    contender = bc.CONTENDERS[name](args.device, image_size=size(args))
    built = rss() if args.device == "cpu" else torch.cuda.memory_allocated() / 2 ** 20
    if mode == "inference":
        images = bc.random_images(1, *size(args), args.device)
        contender.model.eval()
        with torch.no_grad():
            for _ in range(2):
                contender.infer(images)
        batch = 1
    else:
        images = bc.random_images(2, *size(args), args.device)
        targets = bc.random_targets(2, 20, *size(args), args.device)
        step = training_step(contender, args.device, False)
        for _ in range(2):
            step(images, targets)
        batch = 2
    peak = rss() if args.device == "cpu" else torch.cuda.max_memory_allocated() / 2 ** 20
    print(json.dumps({"row": "memory", "contender": contender.name, "mode": mode,
                      "batch": batch, "peak_mib": peak, "built_mib": built}))


def row_parts(args) -> List[dict]:
    return benchmark_parts.run(args.repeats, quick=args.quick)


def row_onnx(args) -> List[dict]:
    """fcos-d2 as configs/FCOS-R50.yaml, random weights, one image, batch 1."""
    import onnxruntime
    from benchmark_onnx import onnx_vs_eager_latency

    if args.device != "cpu":
        print("\n[onnx] skipped: the ONNX row runs on the CPU only")
        return []
    cfg = bc.fcos_d2_cfg("cpu")
    result = onnx_vs_eager_latency(cfg, *size(args), args.threads, args.repeats)
    results = [{"row": "onnx", "contender": name, "batch": 1, "seconds": result[key],
                "image_size": list(size(args)), "detections": result["detections"],
                "onnxruntime": onnxruntime.__version__}
               for name, key in (("fcos-d2 PyTorch eager fp32", "pytorch_eager"),
                                 ("fcos-d2 onnxruntime fp32", "onnxruntime"),
                                 ("fcos-d2 onnxruntime int8", "onnxruntime_int8"))]
    results[-1]["targets"] = {"onnxruntime int8 / onnxruntime fp32 latency (target <= 0.5)":
                              result["onnxruntime_int8"] / result["onnxruntime"]}
    print_table(f"onnx, whole R-50 FCOS, {'x'.join(map(str, size(args)))}, "
                f"{result['detections']} detections, onnxruntime {onnxruntime.__version__}",
                results, "fcos-d2 PyTorch eager fp32")
    return results


def row_loader(args) -> List[dict]:
    import benchmark_loader

    return benchmark_loader.row(args.repeats)


def row_labelenc(args) -> List[dict]:
    import benchmark_labelenc

    return benchmark_labelenc.row(args, interleaved_medians, _backbone_head_macs, size(args))


def row_compile(args) -> List[dict]:
    import benchmark_compile

    return benchmark_compile.row(args, interleaved_medians, training_step, size(args))


ROWS = {"inference": row_inference, "training": row_training, "flops": row_flops,
        "memory": row_memory, "parts": row_parts, "onnx": row_onnx, "loader": row_loader,
        "compile": row_compile, "labelenc": row_labelenc}


def target_ratios(rows: Dict[str, List[dict]], device: str,
                  tag: Optional[str] = None) -> Dict[str, float]:
    """The issue's target ratios, from the rows of this run (batch 1 for inference). A
    ratio of emulated bf16 is no result and is left out. ``tag``: the low-precision rows'
    (default: ``low_tag(device)``)."""
    tag = tag or low_tag(device)
    seconds = {(r["row"], r["contender"]): r["seconds"] for name in ("inference", "training")
               for r in rows.get(name, []) if r["batch"] in (1, 2)}
    inference = {c: t for (row, c), t in seconds.items() if row == "inference"}
    measured = "emulated" not in tag
    ratios = {}
    if inference:
        fp32 = inference["fcos-d2 fp32"]
        ratios["inference fp32 as configured / torchvision fp32 (target <= 0.75)"] = \
            fp32 / inference["torchvision fp32"]
        if measured:
            ratios[f"inference {tag} / fcos-d2 fp32 (target <= 0.55)"] = \
                inference[f"fcos-d2 {tag}"] / fp32
        if rows.get("flops"):
            ratios["inference fp32 as configured / conv floor (target <= 1.25)"] = \
                fp32 / rows["flops"][0]["floor_seconds"]
    training = {c: t for (row, c), t in seconds.items() if row == "training"}
    if training:
        ratios["training fp32 / torchvision fp32 (target <= 0.9)"] = \
            training["fcos-d2 fp32"] / training["torchvision fp32"]
        if measured:
            ratios[f"training {tag} +CL / fcos-d2 fp32 (target <= 0.7)"] = \
                training[f"fcos-d2 {tag} +CL"] / training["fcos-d2 fp32"]
    for row in ("onnx", "loader", "compile"):
        for result in rows.get(row, []):
            ratios.update(result.get("targets", {}))
    if ratios:
        print("\n[targets]" + ("" if measured else f" ({tag}: its ratios are no result, left out)"))
        for name, value in ratios.items():
            print(f"  {value:5.2f}  {name}")
    return ratios


def machine(args) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    info = {"cpu": cpu, "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "detectron2": __import__("detectron2").__version__, "device": args.device}
    if args.device == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS),
                        help=f"comma-separated, from {list(ROWS)} (default: all)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up")
    parser.add_argument("--quick", action="store_true", help="512x768 images instead of 800x1216")
    parser.add_argument("--inference-batches", default="1,4", type=lambda text: [
        int(x) for x in text.split(",")], help="batch sizes of the inference row (default 1,4)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="torch threads for every contender (default: torch's, all cores)")
    parser.add_argument("--json", default="output/benchmark.json", help="where to write results")
    parser.add_argument("--memory-probe", nargs=2, metavar=("CONTENDER", "MODE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [r for r in args.rows.split(",") if r not in ROWS]
    if unknown:
        parser.error(f"--rows: unknown {unknown}, expected some of {list(ROWS)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_probe:
        return memory_probe(*args.memory_probe, args)
    report = {"machine": machine(args), "rows": {}}
    if args.device == "cuda" and not torch.cuda.is_available():
        report["skipped"] = "--device cuda: CUDA is not available on this machine"
        print(f"skipped: {report['skipped']}")
    else:
        print(f"{report['machine']}")
        for name in args.rows.split(","):
            report["rows"][name] = ROWS[name](args)
            write_json(args.json, report)  # after every row: a long run keeps what it did
        report["targets"] = target_ratios(report["rows"], args.device)
    write_json(args.json, report)
    print(f"\nwrote {args.json}")


def write_json(path: str, report: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
