"""Where a trained contender's AP goes, by object size: ``python -m benchmarks.size_breakdown``.

For runs of ``benchmarks.train_quality`` (their weights in ``OUTPUT/runs/<name>-<seed>/
model_final.pth`` and their overrides in ``OUTPUT/results.jsonl``) it rebuilds each model
as it was trained, scores it on the regime's validation images and writes a record to
``benchmarks/results/size_breakdown.jsonl``:

- COCO's AP, AP50, AP75 and AR@100 per size bin (areas of boxes with sides < 16, 16-32,
  32-64, > 64 px), with classes and class-agnostic;
- objects found (a detection covers them at IoU >= 0.5) and named (the best-scored covering
  detection has their class), per size bin of the longer side
  (``fcos_d2.evaluation.detection_errors``);
- the confusion matrix of those detections.

    python -m benchmarks.size_breakdown --run output/train_quality "fcos-d2 recipe:0" \\
        --run output/train_quality "detectron2 faster-rcnn:0" [--regime shapes]

The models of one command are timed side by side (batch 1, one thread, taking turns image
by image), so their ms per image share the load; the records say with which.
"""
import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Tuple

from benchmarks import records

BENCHMARK = "size_breakdown"


class Measured(NamedTuple):
    """One run scored: its name, seed and contender rebuilt as, its results.jsonl line and
    overrides, the breakdown, its config, model and folder."""
    name: str
    seed: int
    build: str
    result: dict
    opts: List[str]
    metrics: Dict
    cfg: Any
    model: Any
    output: Path


def parse_run(text: str) -> Tuple[str, int, str]:
    """"NAME:SEED" or "NAME:SEED@BUILD" -> (NAME, SEED, BUILD): the run of contender NAME
    with SEED, rebuilt as contender BUILD (default NAME; another name where NAME's config
    has changed since the run, e.g. "fcos-d2 recipe+before-issue-60")."""
    run, _, build = text.partition("@")
    name, _, seed = run.rpartition(":")
    if not name or not seed.lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"--run: {text!r} is not NAME:SEED[@CONTENDER]")
    return name, int(seed), build or name


def run_result(output: Path, name: str, seed: int) -> dict:
    """The run's line of ``output/results.jsonl`` (its overrides, times, AP)."""
    path = output / "results.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] \
        if path.is_file() else []
    found = [r for r in lines if r.get("contender") == name and r.get("seed") == seed]
    if not found:
        raise SystemExit(f"{path}: no run of contender {name!r} with seed {seed}")
    return found[-1]


def detections_of(name: str, seed: int, output: Path, regime: str, opts: List[str],
                  build: str = ""):
    """(ground-truth COCO dict, COCO results list, config, model in eval mode) of the run's
    stored weights."""
    import torch
    from detectron2.data import DatasetCatalog, MetadataCatalog, build_detection_test_loader
    from detectron2.evaluation import COCOEvaluator, inference_on_dataset

    from benchmarks.train_quality import catalog, protocol

    run_dir = output / "runs" / f"{name}-{seed}"
    weights = run_dir / "model_final.pth"
    if not weights.is_file():
        raise SystemExit(f"{weights}: not found (the weights of {name!r} seed {seed})")
    torch.set_num_threads(1)
    if protocol.REGIMES[regime].datasets[0][0] not in DatasetCatalog.list():  # once a process
        protocol.register_datasets(regime)
    contender = catalog.contender(build or name)
    cfg = contender.config(seed, str(run_dir), opts, regime)
    model = contender.build(cfg)
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    model.eval()
    val_name = cfg.DATASETS.TEST[0]
    folder = run_dir / "size_breakdown"
    evaluator = COCOEvaluator(val_name, tasks=("bbox",), use_fast_impl=False,
                              output_dir=str(folder))
    with torch.no_grad():
        inference_on_dataset(model, build_detection_test_loader(cfg, val_name), evaluator)
    gt = json.loads(Path(MetadataCatalog.get(val_name).json_file).read_text())
    detections = json.loads((folder / "coco_instances_results.json").read_text())
    return gt, detections, cfg, model


def first_images(cfg, count: int) -> List:
    """The first `count` validation images as the models read them (C, H, W tensors)."""
    from detectron2.data import build_detection_test_loader

    images = []
    for batch in build_detection_test_loader(cfg, cfg.DATASETS.TEST[0]):
        if len(images) >= count:
            break
        images.append(batch[0]["image"])
    return images


def breakdown(gt: dict, detections: List[dict]) -> Dict:
    """The record's metrics (module docstring) of one model's detections."""
    from fcos_d2.evaluation.detection_errors import (coco_box_ap, coco_size_metrics,
                                                     error_table)

    table = error_table(gt, detections)
    return {
        "AP": coco_box_ap(gt, detections, use_categories=True),
        "AP_agnostic": coco_box_ap(gt, detections, use_categories=False),
        "by_size": coco_size_metrics(gt, detections, use_categories=True),
        "by_size_agnostic": coco_size_metrics(gt, detections, use_categories=False),
        "found_named": {name: {"objects": n, "found": found / n if n else None,
                               "named": named / n if n else None}
                        for name, (n, found, named) in table["bins"].items()},
        "confusion": table["confusion"].tolist(),
        "categories": [c["name"] for c in gt["categories"]],
    }


def format_breakdowns(rows: List[Tuple[str, Dict]]) -> str:
    """Markdown: per contender and size bin, AP / AP50 / AP75 / AR100, class-agnostic AP,
    found and named."""
    lines = ["| contender | size (px) | objects | AP | AP50 | AP75 | AR@100 | AP class-agnostic "
             "| found | named |", "| --- " * 10 + "|"]
    from fcos_d2.evaluation.detection_errors import SIZE_BINS

    for label, metrics in rows:
        for size in [name for name, _, _ in SIZE_BINS if name in metrics["by_size"]]:
            coco = metrics["by_size"][size]
            agnostic = metrics["by_size_agnostic"][size]["AP"]
            counts = metrics["found_named"].get(size, {})
            share = (lambda v: "-" if v is None else f"{100 * v:.1f}%")
            lines.append(f"| {label} | {size} | {counts.get('objects', '-')} | {coco['AP']:.1f} | "
                         f"{coco['AP50']:.1f} | {coco['AP75']:.1f} | {coco['AR100']:.1f} | "
                         f"{agnostic:.1f} | {share(counts.get('found'))} | "
                         f"{share(counts.get('named'))} |")
    return "\n".join(lines)


def latencies(models: List, images: List, rounds: int = 5) -> List[float]:
    """Median ms per image of each model (eval mode, batch 1) over `images`, the models
    taking turns image by image so that they share the same load."""
    import time

    import torch

    times = [[] for _ in models]
    with torch.no_grad():
        for model in models:  # warm-up
            model([{"image": images[0]}])
        for _ in range(rounds):
            for image in images:
                for i, model in enumerate(models):
                    start = time.perf_counter()
                    model([{"image": image}])
                    times[i].append(1000.0 * (time.perf_counter() - start))
    return [sorted(t)[len(t) // 2] for t in times]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", nargs=2, action="append", required=True,
                        metavar=("OUTPUT", "NAME:SEED[@CONTENDER]"),
                        help="a train_quality --output and a run in it (repeatable)")
    parser.add_argument("--regime", default="shapes")
    parser.add_argument("--latency-images", type=int, default=20,
                        help="validation images timed per model (batch 1, one thread, the "
                             "models taking turns); 0: no timing")
    args = parser.parse_args(argv)
    import fcos_d2  # noqa: F401  (before detectron2)

    measured = []
    for output, run in args.run:
        (name, seed, build), output = parse_run(run), Path(output)
        result = run_result(output, name, seed)
        opts = list(result.get("opts", []))
        gt, detections, cfg, model = detections_of(name, seed, output, args.regime, opts, build)
        measured.append(Measured(name, seed, build, result, opts, breakdown(gt, detections),
                                 cfg, model, output))
    images = first_images(measured[0].cfg, args.latency_images)
    ms = latencies([m.model for m in measured], images) if images else [None] * len(measured)
    command = shlex.join(["python", "-m", "benchmarks.size_breakdown",
                          *(argv if argv is not None else sys.argv[1:])])
    rows = []
    for m, latency in zip(measured, ms):
        record = records.make_record(
            BENCHMARK, command=command, seed=m.seed, overrides=m.opts, metrics=m.metrics,
            times={"train_seconds": m.result.get("train_seconds"), "ms_per_image": latency},
            run={"contender": m.name, "built_as": m.build, "regime": args.regime,
                 "weights_from": str(m.output), "iterations": m.result.get("iterations"),
                 "trained_AP": m.result.get("AP"),
                 "latency_side_by_side_with": [f"{o.name}:{o.seed}" for o in measured]})
        records.append_record(record)
        rows.append((f"{m.name} (seed {m.seed}, {latency and round(latency, 1)} ms/image)",
                     m.metrics))
    print(format_breakdowns(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
