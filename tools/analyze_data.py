#!/usr/bin/env python
"""Prints how a config's FPN levels fit a dataset, without training: the table training
logs when it starts (objects by size, the level each lands on, positives per object, the
shares with none and with one) and its warnings, naming the keys to change.

    python tools/analyze_data.py --config-file configs/FCOS-R18-small-data.yaml \\
        [--register-coco NAME JSON DIR] [--images N] [--choose] [KEY VALUE ...]

The boxes are those of ``DATASETS.TRAIN`` resized as training resizes them; the assignment
is the model's own. ``--choose`` also prints the levels and ``SIZES_OF_INTEREST`` that
``MODEL.FCOS.LEVELS_FROM_DATA True`` would choose, and the table with them.
"""
import argparse
import sys

import fcos_d2  # noqa: F401  (first: detectron2 v0.6 shims; registers FCOS and datasets)
from detectron2.config import get_cfg
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config
from fcos_d2.data import prepare_dataset
from fcos_d2.data.register import register_coco_dataset
from fcos_d2.engine.level_fit import apply_levels_from_data, fit_report


def load_config(config_file: str, opts, images: int):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(config_file)
    cfg.merge_from_list(list(opts))
    cfg.MODEL.DEVICE = "cpu"  # the model is built for its strides and ranges only
    cfg.MODEL.FCOS.LEVEL_FIT_IMAGES = images
    return cfg


def report(cfg) -> str:
    for name in cfg.DATASETS.TRAIN:
        prepare_dataset(name)  # the built-in synthetic sets are generated on first use
    text = fit_report(cfg, build_model(cfg))
    if text is None:
        raise SystemExit(f"{cfg.MODEL.META_ARCHITECTURE} with MODEL.FCOS.ASSIGNER "
                         f"{cfg.MODEL.FCOS.ASSIGNER}: no FCOS size ranges to fit")
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config-file", required=True)
    parser.add_argument("--register-coco", nargs=3, action="append", default=[],
                        metavar=("NAME", "ANNOTATIONS.json", "IMAGE_DIR"))
    parser.add_argument("--images", type=int, default=2000,
                        help="training images read, at most (evenly spread)")
    parser.add_argument("--choose", action="store_true",
                        help="also the levels MODEL.FCOS.LEVELS_FROM_DATA would choose")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="KEY VALUE overrides")
    args = parser.parse_args(argv)
    for name, json_file, image_root in args.register_coco:
        register_coco_dataset(name, json_file, image_root)
    cfg = load_config(args.config_file, args.opts, max(args.images, 1))
    print(report(cfg))
    if args.choose:
        cfg.MODEL.FCOS.LEVELS_FROM_DATA = True
        print("\n" + apply_levels_from_data(cfg) + "\n")
        print(report(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
