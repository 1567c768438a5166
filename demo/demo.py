#!/usr/bin/env python
"""Runs FCOS on images; saves each with its detections drawn, and a JSON list of them
(with masks, drawn and listed as RLE, for a model that returns ``pred_masks``).

    python demo/demo.py --config-file configs/quickstart.yaml --input a.png b.png \\
        --output demo_output MODEL.WEIGHTS output/quickstart/model_final.pth

For an input ``<dir>/<name>.<ext>`` it writes ``<output>/<name>.png`` and
``<output>/<name>.json`` (format: ``fcos_d2.visualization``). Class names come from the
metadata of the config's first ``DATASETS.TEST``.
"""
import argparse
import logging
import os

import fcos_d2  # noqa: F401  (first: detectron2 v0.6 shims; registers FCOS and datasets)
import numpy as np
import torch
from detectron2.config import get_cfg
from detectron2.data import MetadataCatalog
from detectron2.utils.logger import setup_logger

from fcos_d2 import Predictor, add_fcos_config
from fcos_d2.data.images import read_image
from fcos_d2.visualization import save_detections

logger = logging.getLogger("fcos_d2.demo")


def setup_cfg(args):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    if cfg.MODEL.DEVICE.startswith("cuda") and not torch.cuda.is_available():
        logger.warning("CUDA is not available: running on the CPU.")
        cfg.MODEL.DEVICE = "cpu"
    cfg.freeze()
    return cfg


def read_input(path: str, input_format: str) -> np.ndarray:
    """The image at ``path`` as (H, W, 3) uint8 in ``input_format`` ("BGR" or "RGB");
    exits with a message naming it if it cannot be read."""
    try:
        return read_image(path, format=input_format)
    except OSError as e:  # missing file, no permission, or not an image PIL can decode
        raise SystemExit(f"demo.py: cannot read --input image '{path}': {e}") from e


def main(args):
    cfg = setup_cfg(args)
    predictor = Predictor(cfg, expected_images=len(args.input))  # for INFERENCE_BACKEND auto
    metadata = MetadataCatalog.get(cfg.DATASETS.TEST[0] if cfg.DATASETS.TEST else "__no_dataset")
    for path in args.input:
        image = read_input(path, cfg.INPUT.FORMAT)
        instances = predictor(image)
        instances = instances[instances.scores >= args.confidence_threshold]
        name = os.path.splitext(os.path.basename(path))[0]
        rgb = image[:, :, ::-1] if cfg.INPUT.FORMAT == "BGR" else image
        written = save_detections(rgb, instances, metadata, args.output, name, path)
        logger.info(f"{path}: {len(instances)} detections -> {', '.join(written)}")


def argument_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config-file", required=True, metavar="FILE", help="model config")
    parser.add_argument("--input", required=True, nargs="+", metavar="IMAGE",
                        help="image files to run on")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="folder for the pictures and JSON files (created if missing)")
    parser.add_argument("--confidence-threshold", type=float, default=0.5,
                        help="detections with a lower score are left out")
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[],
                        help="config overrides as KEY VALUE pairs, e.g. MODEL.WEIGHTS model.pth")
    return parser


if __name__ == "__main__":
    setup_logger(name="fvcore")
    setup_logger(name="fcos_d2")
    main(argument_parser().parse_args())
