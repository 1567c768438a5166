"""Evaluates an exported whole-detector ONNX graph with onnxruntime over DATASETS.TEST, as
``train_net.py --eval-only`` evaluates the PyTorch model: the same dataset flags and
checks, test loader (resizing outside the graph), COCOEvaluator settings and AP table, and
a summary.txt block marked "model: ONNX <file>".

    python tools/test_onnx.py --config-file configs/quickstart.yaml --onnx-model fcos.onnx
    python tools/test_onnx.py --config-file my.yaml --onnx-model fcos.onnx \\
        --register-coco my_val val.json val_images DATASETS.TEST "('my_val',)"

The graph's thresholds are those it was exported with; config overrides of MODEL.* change
nothing here. The evaluator's files go to OUTPUT_DIR/onnx/inference/<dataset>, so that they
do not replace the PyTorch model's; the summary block goes to the same summary.txt as its.
"""
import argparse
import os

import fcos_d2  # noqa: F401  (first: detectron2 v0.6 shims; registers FCOS and datasets)
from detectron2.engine import DefaultTrainer
from detectron2.evaluation import verify_results

from fcos_d2.engine.trainer import Trainer, setup
from fcos_d2.evaluation import append_summaries
from fcos_d2.export.runtime import ONNXRuntimeDetector


def build_evaluator(cfg, dataset_name: str):
    """``Trainer.build_evaluator`` (same COCOEvaluator settings), writing its files under
    OUTPUT_DIR/onnx/inference/<dataset>."""
    onnx_cfg = cfg.clone()
    onnx_cfg.defrost()
    onnx_cfg.OUTPUT_DIR = os.path.join(cfg.OUTPUT_DIR, "onnx")
    return Trainer.build_evaluator(onnx_cfg, dataset_name)


def main(args) -> dict:
    if not os.path.isfile(args.onnx_model):
        raise SystemExit(f"test_onnx.py: --onnx-model {args.onnx_model} not found")
    model = ONNXRuntimeDetector(args.onnx_model, threads=args.threads)
    cfg = setup(args)
    evaluators = [build_evaluator(cfg, name) for name in cfg.DATASETS.TEST]
    results = DefaultTrainer.test(cfg, model, evaluators)  # loader, inference, AP table
    append_summaries(cfg.OUTPUT_DIR, cfg.DATASETS.TEST, results, model.iterations_trained,
                     model=f"ONNX {args.onnx_model}")
    verify_results(cfg, results)  # TEST.EXPECTED_RESULTS, as train_net.py --eval-only
    return results


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-file", required=True, metavar="FILE")
    parser.add_argument("--onnx-model", required=True, metavar="FILE.onnx",
                        help="written by tools/export_onnx.py (whole detector)")
    parser.add_argument("--register-coco", nargs=3, action="append", default=[],
                        metavar=("NAME", "ANNOTATIONS.json", "IMAGE_DIR"),
                        help="register a COCO-format dataset under NAME (repeatable)")
    parser.add_argument("--threads", type=int, default=0,
                        help="onnxruntime intra-op threads (0: its default)")
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[],
                        help="config overrides as KEY VALUE pairs (datasets, OUTPUT_DIR)")
    return parser


if __name__ == "__main__":
    arguments = argument_parser().parse_args()
    arguments.eval_only = True  # read by default_setup (via setup)
    main(arguments)
