"""fcos-d2's benchmarks, run from the repository's root as modules:

- ``python -m benchmarks.train_quality``: detection AP of FCOS implementations trained from
  scratch on small synthetic data (``benchmarks/train_quality/``);
- ``python -m benchmarks.masks``: SipMask against detectron2's Mask R-CNN, mask AP and
  latency;
- ``python -m benchmarks.speed``: latency, throughput, FLOPs and memory of the whole R-50
  FCOS against torchvision's and detectron2's;
- ``python -m benchmarks.epochs``: AP against epochs of the small-data recipe (issue 54);
- ``python -m benchmarks.tables``: the docs' tables (docs/results/) from the records.

Every run appends a record (``benchmarks.records``) to ``benchmarks/results/<benchmark>.jsonl``,
which git tracks, besides what it writes under ``output/``. The package is not shipped in
the wheel: it measures a checkout, whose commit each record names.
"""
