"""The rows of the speed benchmark that time the whole R-50 FCOS: inference, training,
flops and memory (each contender's peak in a fresh process: ``--memory-probe``)."""
import json
import subprocess
import sys
from typing import Callable, Dict, List

import torch

from benchmarks.speed import contenders as bc
from benchmarks.speed.floor import attach_floors
from benchmarks.speed.timing import (autocast_call, backbone_head_macs, interleaved_medians,
                                     low_tag, print_table, rss, size, training_step)

REPO = bc.REPO
EVAL_MODE = "fcos-d2 fp32 build_model + eval()"
DEFAULT_PREDICTOR = "fcos-d2 fp32 DefaultPredictor"
MODULE = "benchmarks.speed"


def inference_contenders(device: str, image_size) -> Dict[str, Callable]:
    """name -> infer(images), models in eval mode. fcos-d2 as configured (the fast path of
    MODEL.FCOS.FAST_INFERENCE: folded BN, channels_last), as trained (FAST_INFERENCE
    False), and the low-precision rows: fcos-d2 with MODEL.FCOS.INFERENCE_DTYPE (forced to
    bf16 with CPU_BF16 "always", so that an emulated CPU shows what it costs) and
    torchvision under autocast; and fcos-d2 as detectron2 users call it themselves
    (``build_model`` + ``eval()``, ``DefaultPredictor``)."""
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
        EVAL_MODE: bc.fcos_d2_eval_mode_infer(device),
        DEFAULT_PREDICTOR: bc.default_predictor_infer(device, image_size),
        f"fcos-d2 {low_tag(device)}": low_fast.infer,
        f"torchvision {low_tag(device)}": lambda images: autocast_call(device, tv.infer, images),
    }

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
    attach_floors(results, args.device, size(args), args.repeats, training=False)
    print_table(f"inference, R-50 FCOS, {'x'.join(map(str, size(args)))}, random weights",
                results, "torchvision fp32")
    return results

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
    attach_floors(results, args.device, size(args), args.repeats, training=True)
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
        macs = backbone_head_macs(contender, images)
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

def row_memory(args) -> List[dict]:
    """Peak memory of each contender, one fresh subprocess per (contender, mode)."""
    results = []
    print("\n[peak memory" + (", RSS high-water mark of a fresh process]"
                             if args.device == "cpu" else ", CUDA max allocated]"))
    for name in bc.CONTENDERS:
        for mode in ("inference", "training"):
            command = [sys.executable, "-m", MODULE, "--memory-probe", name, mode,
                       "--device", args.device, "--threads", str(args.threads)]
            if args.quick:
                command.append("--quick")
            probe = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
            if probe.returncode != 0:
                print(f"  {name:12s} {mode:9s} failed: {probe.stderr.strip()[-300:]}")
                continue
            result = json.loads(probe.stdout.strip().splitlines()[-1])
            results.append(result)
            print(f"  {result['contender']:32s} {mode:9s} "
                  f"peak {result['peak_mib']:7.0f} MiB (after building: "
                  f"{result['built_mib']:.0f} MiB)")
    return results

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
