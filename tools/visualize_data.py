#!/usr/bin/env python
"""Draws a dataset's ground truth on its images, to check a dataset before training on it.

    python tools/visualize_data.py --config-file configs/quickstart.yaml \\
        --source annotation --output vis/ [--register-coco NAME JSON DIR] [--num-images 20]

``--source annotation``: the images as stored, with the boxes (and masks, where the
annotations have segmentations) and category names of the datasets of ``DATASETS.TRAIN``
(or ``--dataset NAME``), one ``<output>/<image name>.png`` each. ``--source dataloader``:
the batches training sees (train_net.py's training loader: the config's resizing, flips and
other augmentations, with invalid boxes dropped), as ``<output>/<n>_<image name>.png``.
Trailing ``KEY VALUE`` pairs override the config, as in train_net.py.
"""
import argparse
import itertools
import os
from typing import Iterator, List, Tuple

import fcos_d2  # noqa: F401  (first: detectron2 v0.6 shims; registers FCOS and datasets)
import numpy as np
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.detection_utils import convert_image_to_rgb
from detectron2.utils.visualizer import Visualizer
from PIL import Image

from fcos_d2 import add_fcos_config
from fcos_d2.data import prepare_dataset
from fcos_d2.data.images import read_image
from fcos_d2.data.register import register_coco_dataset

MIN_SIDE = 512  # small images are enlarged to this shorter side, so that labels stay legible


def setup_cfg(args):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    cfg.MODEL.DEVICE = "cpu"  # no model runs; the data loader stays on the CPU
    if args.dataset:
        cfg.DATASETS.TRAIN = tuple(args.dataset)
    cfg.freeze()
    return cfg


def _scale(image: np.ndarray) -> float:
    return max(1.0, MIN_SIDE / min(image.shape[:2]))


def annotated_images(cfg, limit: int) -> Iterator[Tuple[str, np.ndarray]]:
    """(file name, picture) of the dataset dicts as loaded, boxes, masks and names drawn."""
    records = itertools.chain.from_iterable(
        ((name, d) for d in DatasetCatalog.get(name)) for name in cfg.DATASETS.TRAIN)
    for name, record in itertools.islice(records, limit or None):
        image = read_image(record["file_name"], format="RGB", image_id=record.get("image_id"))
        visualizer = Visualizer(image, MetadataCatalog.get(name), scale=_scale(image))
        yield (os.path.splitext(os.path.basename(record["file_name"]))[0],
               visualizer.draw_dataset_dict(record).get_image())


def loader_images(cfg, limit: int) -> Iterator[Tuple[str, np.ndarray]]:
    """(n_file name, picture) of the training loader's images, after augmentation, with the
    boxes, masks and class names the model is trained on."""
    from fcos_d2.engine.trainer import Trainer  # the loader train_net.py trains with

    batches = Trainer.build_train_loader(cfg)  # loads the datasets: sets thing_classes
    metadata = MetadataCatalog.get(cfg.DATASETS.TRAIN[0])
    names = metadata.get("thing_classes", None)
    items = (item for batch in batches for item in batch)
    for count, item in enumerate(itertools.islice(items, limit)):
        image = convert_image_to_rgb(item["image"].permute(1, 2, 0).numpy(), cfg.INPUT.FORMAT)
        fields = item["instances"].get_fields()
        classes = fields["gt_classes"].tolist()
        labels = [names[k] if names and k < len(names) else str(k) for k in classes]
        visualizer = Visualizer(image, metadata, scale=_scale(image))
        picture = visualizer.overlay_instances(labels=labels, boxes=fields.get("gt_boxes"),
                                               masks=fields.get("gt_masks")).get_image()
        yield f"{count:04d}_{os.path.splitext(os.path.basename(item['file_name']))[0]}", picture


def main(args) -> List[str]:
    for name, json_file, image_root in args.register_coco:
        register_coco_dataset(name, json_file, image_root)
    cfg = setup_cfg(args)
    for name in cfg.DATASETS.TRAIN:
        prepare_dataset(name)
    os.makedirs(args.output, exist_ok=True)
    pictures = annotated_images(cfg, args.num_images) if args.source == "annotation" \
        else loader_images(cfg, args.num_images or 20)
    written = []
    for name, picture in pictures:
        written.append(os.path.join(args.output, name + ".png"))
        Image.fromarray(picture).save(written[-1])
    print(f"wrote {len(written)} pictures to {args.output}")
    return written


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-file", required=True, metavar="FILE")
    parser.add_argument("--source", required=True, choices=["annotation", "dataloader"],
                        help="annotation: images as stored; dataloader: after the training "
                             "augmentations")
    parser.add_argument("--output", required=True, metavar="DIR", help="where the PNGs go")
    parser.add_argument("--register-coco", nargs=3, action="append", default=[],
                        metavar=("NAME", "ANNOTATIONS.json", "IMAGE_DIR"),
                        help="register a COCO-format dataset under NAME (repeatable)")
    parser.add_argument("--dataset", action="append", default=[], metavar="NAME",
                        help="draw this dataset instead of DATASETS.TRAIN (repeatable)")
    parser.add_argument("--num-images", type=int, default=0, metavar="N",
                        help="at most N images (0: all for annotation, 20 for dataloader)")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides: KEY VALUE ...")
    return parser


if __name__ == "__main__":
    main(argument_parser().parse_args())
