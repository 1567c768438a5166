"""Exports a trained FCOS to ONNX (backbone, head and box decoding; NMS left to the runtime)
and checks the exported graph against PyTorch with onnxruntime.

Usage:
    python tools/export_onnx.py --config-file configs/FCOS-R50.yaml --height 800 --width 1216 \
        --output fcos.onnx MODEL.WEIGHTS model_final.pth

Inputs/outputs of the graph: see fcos_d2/export/dense.py (``images`` (N, 3, H, W) float pixels in
INPUT.FORMAT; ``boxes`` (N, R, 4) and ``scores`` (N, R, K)).
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import fcos_d2  # noqa: E402  (registers FCOS; before detectron2)
from detectron2.checkpoint import DetectionCheckpointer  # noqa: E402
from detectron2.config import get_cfg  # noqa: E402
from detectron2.modeling import build_model  # noqa: E402
from fcos_d2.export import FCOSDenseOutputs  # noqa: E402


def export(cfg, height: int, width: int, output: str, opset: int = 17) -> float:
    """Writes the ONNX file; returns the largest |onnxruntime - PyTorch| over its outputs."""
    divisor = 32
    if height % divisor or width % divisor:
        raise ValueError(f"--height {height} / --width {width}: must be multiples of {divisor} "
                         "(pad the images as the model does)")
    model = build_model(cfg).eval()
    DetectionCheckpointer(model).load(cfg.MODEL.WEIGHTS)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-file", required=True)
    parser.add_argument("--height", type=int, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides, KEY VALUE")
    args = parser.parse_args()
    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    cfg.MODEL.DEVICE = "cpu"
    error = export(cfg, args.height, args.width, args.output)
    print(f"wrote {args.output}; onnxruntime vs PyTorch: max abs difference {error:.2e}")


if __name__ == "__main__":
    main()
