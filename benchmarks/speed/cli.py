"""The command of the speed benchmark (``python -m benchmarks.speed``; the rows are described
in ``benchmarks/speed/__init__.py``): the rows by name, the target ratios, the JSON report
and the run's record."""
import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

import benchmarks.speed as package
from benchmarks import records
from benchmarks.speed import contenders as bc, parts
from benchmarks.speed.timing import (backbone_head_macs, interleaved_medians, low_tag,
                                     print_table, size, training_step)
from benchmarks.speed.whole_model import (DEFAULT_PREDICTOR, EVAL_MODE, memory_probe, row_flops,
                                          row_inference, row_memory, row_training)

BENCHMARK = "speed"  # benchmarks/results/speed.jsonl


def row_parts(args) -> List[dict]:
    return parts.run(args.repeats, quick=args.quick)


def row_onnx(args) -> List[dict]:
    """fcos-d2 as configs/FCOS-R50.yaml, random weights, one image, batch 1."""
    import onnxruntime
    from benchmarks.speed.onnx_row import onnx_vs_eager_latency

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
    from benchmarks.speed import loader_row

    return loader_row.row(args.repeats)


def row_labelenc(args) -> List[dict]:
    from benchmarks.speed import labelenc_row

    return labelenc_row.row(args, interleaved_medians, backbone_head_macs, size(args))


def row_host(args) -> List[dict]:
    from benchmarks.speed import host_row

    return host_row.row(args)


def row_compile(args) -> List[dict]:
    from benchmarks.speed import compile_row

    return compile_row.row(args, interleaved_medians, training_step, size(args))


def row_backends(args) -> List[dict]:
    from benchmarks.speed import backends_row
    from benchmarks.speed.timing import bf16_kind

    size_hw = tuple(int(x) for x in args.backends_size.split("x"))
    return backends_row.row(args, interleaved_medians, size_hw, bf16_kind(args.device))


def row_backends_ap(args) -> List[dict]:
    from benchmarks.speed import backends_ap_row

    return backends_ap_row.row(args)


def row_entry(args) -> List[dict]:
    from benchmarks.speed import entry_row

    return entry_row.row(args)


ROWS = {"inference": row_inference, "training": row_training, "flops": row_flops,
        "memory": row_memory, "parts": row_parts, "onnx": row_onnx, "loader": row_loader,
        "compile": row_compile, "labelenc": row_labelenc, "host": row_host,
        "backends": row_backends, "backends-ap": row_backends_ap, "entry": row_entry}
# rows that need arguments (backends-ap) or take minutes (entry): run only when named
ON_REQUEST = ("backends-ap", "entry")


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
        for name in (EVAL_MODE, DEFAULT_PREDICTOR):  # as detectron2 users call the model
            if name in inference:
                ratios[f"inference {name[len('fcos-d2 '):]} / torchvision fp32 "
                       "(target <= 0.75)"] = inference[name] / inference["torchvision fp32"]
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
    for row in ("onnx", "loader", "compile", "host", "backends", "backends-ap", "entry"):
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
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speed",
                                     description=package.__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(r for r in ROWS if r not in ON_REQUEST),
                        help=f"comma-separated, from {list(ROWS)} (default: all but "
                             f"{list(ON_REQUEST)})")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up")
    parser.add_argument("--quick", action="store_true", help="512x768 images instead of 800x1216")
    parser.add_argument("--inference-batches", default="1,4", type=lambda text: [
        int(x) for x in text.split(",")], help="batch sizes of the inference row (default 1,4)")
    parser.add_argument("--backends-size", default="800x1216",
                        help="HxW of the backends row (compiling R-50 takes minutes per size)")
    parser.add_argument("--entry-images", type=int, default=50,
                        help="entry: images of its test set (default 50)")
    parser.add_argument("--entry-size", default=None, metavar="HxW",
                        help="entry: image size (default 800x1216; with --quick 512x768)")
    parser.add_argument("--ap-model", nargs=2, action="append", default=[],
                        metavar=("CONFIG", "WEIGHTS"),
                        help="backends-ap: a trained model to evaluate (repeatable)")
    parser.add_argument("--ap-output", default="output/backends_ap",
                        help="backends-ap: OUTPUT_DIR of the evaluations (<config>/<backend>)")
    parser.add_argument("--ap-register-coco", nargs=3, action="append", default=[],
                        metavar=("NAME", "ANNOTATIONS.json", "IMAGE_DIR"),
                        help="backends-ap: register a COCO-format test set (repeatable)")
    parser.add_argument("--ap-emulated", action="store_true",
                        help="backends-ap: evaluate bf16/int8 where this CPU emulates them")
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
    if "backends-ap" in args.rows.split(","):
        from benchmarks.speed.backends_ap_row import USAGE
        missing = [p for pair in args.ap_model for p in pair if not Path(p).is_file()]
        if not args.ap_model or missing:
            parser.error(f"--ap-model: no such file {missing}" if missing else USAGE)
    return args


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
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
        start = time.perf_counter()
        for name in args.rows.split(","):
            report["rows"][name] = ROWS[name](args)
            write_json(args.json, report)  # after every row: a long run keeps what it did
        report["targets"] = target_ratios(report["rows"], args.device)
        seconds = time.perf_counter() - start
        path = records.append_record(run_record(report, args, argv, seconds))
        print(f"\nrecorded in {path}")
    write_json(args.json, report)
    print(f"\nwrote {args.json}")


def run_record(report: dict, args, argv: List[str], seconds: float) -> dict:
    """The ``benchmarks.records`` record of a run: every row's results and the targets as
    metrics; the machine (torch, detectron2, device, threads, GPU) and options under "run".
    The speed rows use random weights and inputs seeded 0, and no config overrides (the
    backends-ap row: the trained models of ``--ap-model``, in the options)."""
    options = {"rows": args.rows.split(","), "repeats": args.repeats, "quick": args.quick,
               "inference_batches": args.inference_batches, "threads": args.threads}
    if args.ap_model:
        options["ap_models"] = [list(pair) for pair in args.ap_model]
        options["ap_register_coco"] = [list(triple) for triple in args.ap_register_coco]
    if "entry" in options["rows"]:
        from benchmarks.speed.entry_row import entry_size
        options.update(entry_images=args.entry_images, entry_size=list(entry_size(args)))
    return records.make_record(
        BENCHMARK, command=f"python -m benchmarks.speed {shlex.join(argv)}", seed=0,
        overrides=[], metrics={"rows": report["rows"], "targets": report["targets"]},
        times={"total_seconds": round(seconds, 1)},
        run={"machine": report["machine"], "options": options})


def write_json(path: str, report: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
