"""Exports a trained FCOS to ONNX: by default the whole detector in one graph (images in,
detections out), checked against PyTorch with onnxruntime on two image sizes.

Usage:
    python tools/export_onnx.py --config-file configs/quickstart.yaml --output fcos.onnx \\
        MODEL.WEIGHTS output/quickstart/model_final.pth
    # also a TorchScript file of the same module (needs torch + torchvision to run):
    python tools/export_onnx.py ... --torchscript fcos.pt
    # the dense graph of earlier versions (no thresholds, no NMS), at a fixed size:
    python tools/export_onnx.py ... --dense --height 800 --width 1216

The whole graph's inputs and outputs: see fcos_d2/export/onnx_graph.py (``images``
(N, 3, H, W) pixels in INPUT.FORMAT, ``image_sizes`` (N, 2); ``boxes``, ``scores``,
``classes``, ``batch_index``). The dense graph's: see fcos_d2/export/dense.py.
"""
import argparse
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import fcos_d2  # noqa: E402  (registers FCOS; before detectron2)
from fcos_d2.checkpoint import FCOSCheckpointer  # noqa: E402
from detectron2.config import get_cfg  # noqa: E402
from detectron2.modeling import build_model  # noqa: E402
from fcos_d2.export import FCOSDenseOutputs  # noqa: E402
from fcos_d2.modeling.fast_inference import fast_inference_enabled, inference_model  # noqa: E402
from fcos_d2.export.files import (INPUT_DTYPES, check_against_pytorch, check_sizes,  # noqa: E402
                                  export_onnx, onnxruntime_runner, torchscript_runner,
                                  trace_torchscript)


def export_dense(model, height: int, width: int, output: str, opset: int = 17) -> float:
    """Writes the dense graph; returns the largest |onnxruntime - PyTorch| over its outputs."""
    divisor = model.backbone.size_divisibility
    if height % divisor or width % divisor:
        raise SystemExit(f"--height {height} / --width {width}: must be multiples of {divisor} "
                         "(pad the images as the model does)")
    wrapper = FCOSDenseOutputs(model).eval()
    sample = torch.rand(1, 3, height, width) * 255
    torch.onnx.export(wrapper, (sample,), output, input_names=["images"],
                      output_names=["boxes", "scores"], opset_version=opset, dynamo=False,
                      dynamic_axes={"images": {0: "N"}, "boxes": {0: "N"}, "scores": {0: "N"}})
    import onnxruntime

    session = onnxruntime.InferenceSession(output, providers=["CPUExecutionProvider"])
    got = session.run(None, {"images": sample.numpy()})
    with torch.no_grad():
        expected = wrapper(sample)
    return max(float(np.abs(g - e.numpy()).max()) for g, e in zip(got, expected))


def export_whole(cfg, model, args, iterations: Optional[int]) -> bool:
    """Writes the whole-detector graph (and the TorchScript file); prints the agreement
    with PyTorch per check size; returns whether everything agrees."""
    export_onnx(model, args.output, opset=args.opset, input_dtype=args.input_dtype,
                iterations=iterations)
    sizes = check_sizes(cfg.INPUT.MIN_SIZE_TEST)
    lines = [f"onnxruntime, {line}" for line in check_against_pytorch(
        model, onnxruntime_runner(args.output), sizes, args.input_dtype)]
    print(f"wrote {args.output} (opset {args.opset}, whole detector)")
    if args.torchscript:
        trace_torchscript(model, args.torchscript, args.input_dtype)
        lines += [f"TorchScript, {line}" for line in check_against_pytorch(
            model, torchscript_runner(args.torchscript), sizes, args.input_dtype)]
        print(f"wrote {args.torchscript} (TorchScript, whole detector)")
    print("\n".join(lines))
    return all(line.split(", ", 1)[1].startswith("agree") for line in lines)


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-file", required=True, metavar="FILE")
    parser.add_argument("--output", required=True, metavar="FILE.onnx")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset (>= 11)")
    parser.add_argument("--input-dtype", choices=sorted(INPUT_DTYPES), default="float32",
                        help="element type of the graph's 'images' input")
    parser.add_argument("--torchscript", metavar="FILE.pt",
                        help="also write the whole detector as a traced TorchScript file")
    parser.add_argument("--dense", action="store_true",
                        help="export the dense graph (boxes and scores of every location, no "
                             "thresholds or NMS) at a fixed --height x --width instead")
    parser.add_argument("--height", type=int, help="--dense only: input height")
    parser.add_argument("--width", type=int, help="--dense only: input width")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides, KEY VALUE")
    return parser


def main() -> None:
    args = argument_parser().parse_args()
    if args.dense and (args.height is None or args.width is None):
        raise SystemExit("--dense needs --height and --width")
    if args.opset < 11:
        raise SystemExit(f"--opset {args.opset}: the whole graph needs opset 11 or later "
                         "(NonMaxSuppression with dynamic inputs)")
    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    cfg.MODEL.DEVICE = "cpu"
    model = build_model(cfg).eval()
    checkpoint = FCOSCheckpointer.from_config(cfg, model).load(cfg.MODEL.WEIGHTS)
    iteration = checkpoint.get("iteration")  # 0-based, of the last finished iteration
    model = inference_model(model, fast_inference_enabled(cfg))  # folded BN, channels_last
    if args.dense:
        error = export_dense(model, args.height, args.width, args.output, args.opset)
        print(f"wrote {args.output}; onnxruntime vs PyTorch: max abs difference {error:.2e}")
    elif not export_whole(cfg, model, args, None if iteration is None else iteration + 1):
        raise SystemExit("the exported detector disagrees with PyTorch (lines marked DIFFER)")


if __name__ == "__main__":
    main()
