#!/usr/bin/env python
"""Where does a detector's AP go: finding the objects, or naming them?

Reads a COCO results file (``coco_instances_results.json``, which ``COCOEvaluator`` writes
into ``OUTPUT_DIR/inference/<dataset>/``) and the dataset's COCO annotations, and prints

- box AP with classes (COCO's) and class-agnostic (``useCats = 0``): the difference is
  what wrong class labels cost;
- per object size (the box's longer side, px): the fraction of objects that some
  detection covers at IoU >= 0.5 ("found"), and the fraction whose best-scored covering
  detection has the right class ("named");
- the confusion matrix of that best-scored covering detection (rows: the object's class,
  columns: the detection's class, last column: no covering detection).

Usage:
    python tools/detection_errors.py --results OUT/inference/synthetic_masks_val/coco_instances_results.json \
        --dataset synthetic_masks_val        # or --annotations path/to/instances.json
"""
import argparse
import json
import sys
from pathlib import Path

# the functions live in the package; imported here for the command and its tests
from fcos_d2.evaluation.detection_errors import (MISSED, SIZE_BINS, best_covering_classes,  # noqa: F401
                                                 coco_box_ap, error_table, format_report,
                                                 size_bin_masks)


def annotations_of(dataset: str) -> Path:
    """The COCO json of a registered dataset (the built-in synthetic sets are generated)."""
    import fcos_d2  # noqa: F401  (registers the built-in datasets)
    from detectron2.data import MetadataCatalog
    from fcos_d2.data.synthetic import is_synthetic, prepare_synthetic_shapes
    if is_synthetic(dataset):
        prepare_synthetic_shapes(dataset)
    json_file = MetadataCatalog.get(dataset).get("json_file", None)
    if not json_file:
        raise ValueError(f"--dataset {dataset}: no json_file in its metadata; "
                         f"pass --annotations instead")
    return Path(json_file)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", required=True, help="coco_instances_results.json")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--dataset", help="a registered dataset name")
    group.add_argument("--annotations", help="a COCO annotation json")
    parser.add_argument("--iou", type=float, default=0.5, help="IoU that counts as covering")
    args = parser.parse_args(argv)
    path = Path(args.annotations) if args.annotations else annotations_of(args.dataset)
    for label, file in (("--annotations", path), ("--results", Path(args.results))):
        if not file.is_file():
            raise SystemExit(f"{label}: {file} not found")
    gt = json.loads(path.read_text())
    detections = json.loads(Path(args.results).read_text())
    known = {c["id"] for c in gt["categories"]}
    unknown = sorted({d["category_id"] for d in detections} - known)
    if unknown:
        raise SystemExit(f"--results {args.results}: category_id {unknown} not in {path}")
    table = error_table(gt, detections, iou_threshold=args.iou)
    names = [c["name"] for c in gt["categories"]]
    print(format_report(table, names, coco_box_ap(gt, detections, use_categories=True),
                        coco_box_ap(gt, detections, use_categories=False)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
