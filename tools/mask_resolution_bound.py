#!/usr/bin/env python
"""The mask AP cap of SipMask's pipeline, per setting and per object size.

A perfect predictor (ground-truth boxes; as its mask, the training target itself) runs
through fcos-d2's own target making, crop, paste and threshold
(``fcos_d2.modeling.sipmask.mask_cap``); its oracle mask AP over a dataset is the most any
training of SipMask can reach with those settings. Sizes: the box's longer side in pixels.
``--coco`` adds pycocotools' segm AP of the same masks, scored by their IoUs (COCO's
101-point recall sampling puts it a little below the oracle AP).

Usage:
    python tools/mask_resolution_bound.py [--dataset synthetic_masks_val]
        [--presets official defaults ...] [--coco] [--record]
"""
import argparse
import dataclasses
import sys
import time
from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor

from fcos_d2.modeling.sipmask.mask_cap import (SIZE_LABELS, PipelineSettings, caps_by_size,
                                               empty_target_flags, mask_iou, pipeline_masks)

OFFICIAL = PipelineSettings()  # SipMask's target, crop, paste and 0.4 threshold
DEFAULTS = PipelineSettings(mask_target="area", empty_targets="keep_peak",
                            crop_rule="cell_centre", paste_stride=1)  # MODEL.SIPMASK's
PRESETS: Dict[str, PipelineSettings] = {
    "official": OFFICIAL,
    "official, threshold 0.5": dataclasses.replace(OFFICIAL, mask_threshold=0.5),
    "official, keep_peak": dataclasses.replace(OFFICIAL, empty_targets="keep_peak"),
    "official, area targets": dataclasses.replace(OFFICIAL, mask_target="area"),
    "official, area targets, threshold 0.5": dataclasses.replace(
        OFFICIAL, mask_target="area", mask_threshold=0.5),
    "official, cell_centre": dataclasses.replace(OFFICIAL, crop_rule="cell_centre"),
    "official, paste stride 1": dataclasses.replace(OFFICIAL, paste_stride=1),
    "official, boxes +0.5 px": dataclasses.replace(OFFICIAL, box_shift=0.5),
    "official, cell_centre, boxes +0.5 px": dataclasses.replace(
        OFFICIAL, crop_rule="cell_centre", box_shift=0.5),
    "official, basis stride 4 (P2)": dataclasses.replace(OFFICIAL, basis_stride=4),
    "official, basis stride 8 (P3)": dataclasses.replace(OFFICIAL, basis_stride=8),
    "defaults": DEFAULTS,
    "defaults, boxes +0.5 px": dataclasses.replace(DEFAULTS, box_shift=0.5),
    "defaults, paste stride 2": dataclasses.replace(DEFAULTS, paste_stride=2),
    "defaults, threshold 0.5": dataclasses.replace(DEFAULTS, mask_threshold=0.5),
    "defaults, basis stride 4 (P2)": dataclasses.replace(DEFAULTS, basis_stride=4),
    "defaults, basis stride 8 (P3)": dataclasses.replace(DEFAULTS, basis_stride=8),
}


def render_thin_images(split: str) -> List[Tuple[Tensor, Tensor]]:
    """The thin-shapes split's images (``fcos_d2.data.synthetic_thin``, whose annotations
    hold boxes only) rendered again with their objects' masks."""
    from fcos_d2.data import synthetic_thin

    images = []
    for index in range(synthetic_thin.NUM_IMAGES[split]):
        _, objects = synthetic_thin.render_thin_image(seed=synthetic_thin.SPLIT_SEEDS[split],
                                                      index=index)
        if objects:
            masks = torch.stack([torch.from_numpy(visible).bool() for _, visible in objects])
            rows, cols = masks.any(2), masks.any(1)  # (M, H), (M, W)
            boxes = [[c.nonzero().min(), r.nonzero().min(), c.nonzero().max() + 1,
                      r.nonzero().max() + 1] for r, c in zip(rows, cols)]
            images.append((masks, torch.tensor(boxes, dtype=torch.float32)))
    return images


def load_images(dataset: str) -> List[Tuple[Tensor, Tensor]]:
    """Per image of a registered COCO-style dataset with masks, or of the thin shapes
    (``synthetic_thin_val``/``_train``): (M, H, W) bool masks, (M, 4) XYXY."""
    import fcos_d2  # noqa: F401  registers the built-in datasets

    if dataset in ("synthetic_thin_train", "synthetic_thin_val"):
        return render_thin_images(dataset.rsplit("_", 1)[1])
    from detectron2.data import DatasetCatalog
    from pycocotools import mask as mask_util

    images = []
    for record in DatasetCatalog.get(dataset):
        masks, boxes = [], []
        for ann in record["annotations"]:
            segm = ann.get("segmentation")
            if segm is None:
                raise ValueError(f"{dataset}: image {record.get('file_name')} has an "
                                 "annotation without segmentation")
            if not isinstance(segm, dict):  # polygons
                segm = mask_util.merge(mask_util.frPyObjects(segm, record["height"],
                                                             record["width"]))
            masks.append(torch.from_numpy(mask_util.decode(segm)).bool())
            x, y, w, h = ann["bbox"]
            boxes.append([x, y, x + w, y + h])
        if masks:
            images.append((torch.stack(masks), torch.tensor(boxes, dtype=torch.float32)))
    return images


def longer_sides(images: Sequence[Tuple[Tensor, Tensor]]) -> Tensor:
    boxes = torch.cat([b for _, b in images])
    return torch.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])


def coco_segm_ap(images: Sequence[Tuple[Tensor, Tensor]], pasted: Sequence[Tensor]) -> float:
    """pycocotools' segm AP (x100, all sizes) of one detection per object, its mask
    ``pasted`` and its score its IoU (a perfect predictor's scores)."""
    import contextlib
    import io

    import numpy as np
    from pycocotools import mask as mask_util
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    def rle(mask: Tensor) -> dict:
        encoded = mask_util.encode(np.asfortranarray(mask.numpy().astype(np.uint8)))
        return {**encoded, "counts": encoded["counts"].decode()}

    truth, found, infos = [], [], []
    for image_id, ((masks, boxes), predicted) in enumerate(zip(images, pasted)):
        infos.append({"id": image_id, "height": masks.shape[1], "width": masks.shape[2]})
        for mask, box, pred, iou in zip(masks, boxes, predicted, mask_iou(predicted, masks)):
            x1, y1, x2, y2 = box.tolist()
            truth.append({"id": len(truth) + 1, "image_id": image_id, "category_id": 1,
                          "iscrowd": 0, "segmentation": rle(mask), "area": float(mask.sum()),
                          "bbox": [x1, y1, x2 - x1, y2 - y1]})
            found.append({"image_id": image_id, "category_id": 1, "segmentation": rle(pred),
                          "score": float(iou)})
    coco = COCO()
    coco.dataset = {"images": infos, "annotations": truth,
                    "categories": [{"id": 1, "name": "object"}]}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        coco.createIndex()
        evaluation = COCOeval(coco, coco.loadRes(found), "segm")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return float(evaluation.stats[0]) * 100


def main(argv: Sequence[str] = None) -> Dict[str, Dict[str, Tuple[int, float]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="synthetic_masks_val")
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS),
                        metavar="PRESET", help=f"among: {'; '.join(PRESETS)}")
    parser.add_argument("--coco", action="store_true",
                        help="also pycocotools' segm AP of the perfect predictor (scores: IoUs)")
    parser.add_argument("--record", action="store_true",
                        help="append a record to benchmarks/results/mask_cap.jsonl")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    images = load_images(args.dataset)
    sides = longer_sides(images)
    print(f"{args.dataset}: {len(sides)} objects in {len(images)} images")
    columns = [*SIZE_LABELS, *(["COCO AP"] if args.coco else [])]
    print("| settings | " + " | ".join(columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    tables, start = {}, time.time()
    for name in args.presets:
        pasted = pipeline_masks(images, PRESETS[name])
        ious = torch.cat([mask_iou(p, masks) for p, (masks, _) in zip(pasted, images)])
        caps = caps_by_size(ious, sides)
        if args.coco:
            caps["COCO AP"] = (len(ious), coco_segm_ap(images, pasted))
        tables[name] = caps
        print(f"| {name} | " + " | ".join(f"{ap:.1f}" for _, ap in caps.values()) + " |")
    print("objects: " + ", ".join(f"{k} {n}" for k, (n, _) in tables[args.presets[0]].items()))
    empty = empty_target_flags(images)
    small = sides < 16
    print(f"objects whose threshold target is empty: {int(empty.sum())} of {len(empty)}; "
          f"under 16 px {int(empty[small].sum())} of {int(small.sum())}")
    if args.record:
        write_record(args, tables, time.time() - start)
    return tables


def write_record(args, tables, seconds: float) -> None:
    from benchmarks.records import append_record, make_record

    metrics = {name: {label: ap for label, (_, ap) in caps.items()}
               for name, caps in tables.items()}
    settings = {name: dataclasses.asdict(PRESETS[name]) for name in tables}
    path = append_record(make_record(
        "mask_cap", command=" ".join(["python", "tools/mask_resolution_bound.py", *sys.argv[1:]]),
        seed=0, overrides=[], metrics=metrics, times={"total": seconds},
        run={"dataset": args.dataset, "settings": settings}))
    print(f"record appended to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
