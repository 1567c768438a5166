"""Exports a trained FCOS to ONNX: by default the whole detector in one graph (images in,
detections out), checked against PyTorch with onnxruntime on two image sizes.

Usage:
    python tools/export_onnx.py --config-file configs/quickstart.yaml --output fcos.onnx \\
        MODEL.WEIGHTS output/quickstart/model_final.pth
    # also a TorchScript file of the same module (needs torch + torchvision to run):
    python tools/export_onnx.py ... --torchscript fcos.pt
    # int8 (onnxruntime static quantization), calibrated on 64 images of DATASETS.TEST:
    python tools/export_onnx.py ... --output fcos_int8.onnx --int8 --calibration-images 64
    # the dense graph of earlier versions (no thresholds, no NMS), at a fixed size:
    python tools/export_onnx.py ... --dense --height 800 --width 1216

The whole graph's inputs and outputs: see fcos_d2/export/onnx_graph.py (``images``
(N, 3, H, W) pixels in INPUT.FORMAT, ``image_sizes`` (N, 2); ``boxes``, ``scores``,
``classes``, ``batch_index``). The dense graph's: see fcos_d2/export/dense.py.
"""
import argparse
import os
import tempfile
from typing import Optional


import numpy as np
import torch

import fcos_d2  # noqa: F401  (registers FCOS; before detectron2)
from fcos_d2.checkpoint import FCOSCheckpointer
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from fcos_d2.export import FCOSDenseOutputs
from fcos_d2.modeling.fast_inference import fast_inference_enabled, inference_model
from fcos_d2.export.files import (INPUT_DTYPES, check_against_pytorch, check_sizes,
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


def export_int8(cfg, model, args, iterations: Optional[int]) -> bool:
    """Writes the int8 graph (fcos_d2/export/int8.py) to --output, calibrated on
    --calibration-images images of DATASETS.TEST (or TRAIN); prints its agreement with
    PyTorch float32 under the int8 tolerances; returns whether it agrees."""
    from detectron2.data import DatasetCatalog

    from fcos_d2.data import prepare_dataset
    from fcos_d2.data.mapper import FCOSDatasetMapper
    from fcos_d2.export import int8

    datasets = cfg.DATASETS.TEST if args.calibration_split == "test" else cfg.DATASETS.TRAIN
    if not datasets:
        raise SystemExit(f"--int8: DATASETS.{args.calibration_split.upper()} is empty; "
                         "calibration needs images")
    prepare_dataset(datasets[0])
    feeds = int8.calibration_inputs(DatasetCatalog.get(datasets[0]),
                                    FCOSDatasetMapper(cfg, is_train=False), args.calibration_images)
    with tempfile.TemporaryDirectory() as folder:
        float_path = os.path.join(folder, "fp32.onnx")
        export_onnx(model, float_path, opset=args.opset, input_dtype=args.input_dtype,
                    iterations=iterations)
        kept = int8.quantize_int8(float_path, args.output, feeds)
    print(f"wrote {args.output} (opset {args.opset}, whole detector, int8 QDQ: "
          f"{kept['quantized_ops']} ops of backbone, FPN and towers in int8, of them "
          f"{kept['quantized_convs']} convs, calibrated on {len(feeds)} images of "
          f"{datasets[0]}; kept in float32: {', '.join(kept['float_convs'])})")
    lines = check_against_pytorch(
        model, onnxruntime_runner(args.output), check_sizes(cfg.INPUT.MIN_SIZE_TEST),
        args.input_dtype, score_tolerance=int8.INT8_SCORE_TOLERANCE,
        box_tolerance=int8.INT8_BOX_TOLERANCE, score_floor=int8.INT8_SCORE_FLOOR)
    print(f"int8 against PyTorch float32 (scores >= {int8.INT8_SCORE_FLOOR}, tolerances: score "
          f"{int8.INT8_SCORE_TOLERANCE}, box {int8.INT8_BOX_TOLERANCE} px):")
    print("\n".join(f"onnxruntime int8, {line}" for line in lines))
    return all(line.startswith("agree") for line in lines)


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
    parser.add_argument("--int8", action="store_true",
                        help="write the whole detector quantized to int8 (onnxruntime static "
                             "quantization, QDQ, per-channel weights)")
    parser.add_argument("--calibration-images", type=int, default=64, metavar="N",
                        help="--int8: images to calibrate the activation ranges on")
    parser.add_argument("--calibration-split", choices=("test", "train"), default="test",
                        help="--int8: calibrate on DATASETS.TEST[0] or DATASETS.TRAIN[0]")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides, KEY VALUE")
    return parser


def main() -> None:
    args = argument_parser().parse_args()
    if args.int8 and (args.dense or args.torchscript):
        raise SystemExit("--int8 writes the whole-detector ONNX graph only: drop --dense and "
                         "--torchscript")
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
    elif args.int8:
        if not export_int8(cfg, model, args, None if iteration is None else iteration + 1):
            raise SystemExit("the int8 detector disagrees with PyTorch beyond the int8 "
                             "tolerances (lines marked DIFFER)")
    elif not export_whole(cfg, model, args, None if iteration is None else iteration + 1):
        raise SystemExit("the exported detector disagrees with PyTorch (lines marked DIFFER)")


if __name__ == "__main__":
    main()
