"""Re-evaluation of the training-quality benchmark's stored runs on further validation images
(``python -m benchmarks.train_quality --reevaluate N``).

Every run of the benchmark keeps its weights (``OUTPUT/runs/<contender>-<seed>/
model_final.pth``) and is scored on the regime's first VAL_IMAGES validation images. This
scores the same weights on the N validation images after those (the generators render
image i of a split from (split seed, i) alone, so the first VAL_IMAGES of a longer split
are the scored ones and the rest are new). If a contender's seeds differ as much on the new
images, the spread is the trained models' and not the sampling of a small evaluation set.
"""
import json
import statistics
from pathlib import Path
from typing import Callable, Dict, List, Optional

from benchmarks.runner import load_results

EXTRA_VAL_NAME = "train_quality_{regime}_val_extra_{count}"


def further_images(coco: dict, skip: int) -> dict:
    """The COCO dict `coco` without its first `skip` images (by id) and their annotations."""
    ids = sorted(image["id"] for image in coco["images"])
    if len(ids) <= skip:
        raise ValueError(f"further_images: the split holds {len(ids)} images, none after the "
                         f"first {skip}")
    keep = set(ids[skip:])
    return {**coco, "images": [im for im in coco["images"] if im["id"] in keep],
            "annotations": [a for a in coco["annotations"] if a["image_id"] in keep]}


def stored_runs(runs_folder: Path, contenders: Optional[List[str]] = None) -> List[tuple]:
    """(contender, seed, weights file) of each run folder ``<contender>-<seed>`` holding a
    ``model_final.pth``, sorted; only `contenders` where given. LabelEnc runs keep theirs
    under step2/ and are left out (their re-evaluation would need step 2's plain FCOS)."""
    found = []
    for folder in sorted(p for p in runs_folder.iterdir() if p.is_dir()):
        name, _, seed = folder.name.rpartition("-")
        weights = folder / "model_final.pth"
        if not seed.isdigit() or not weights.is_file():
            continue
        if contenders is None or name in contenders:
            found.append((name, int(seed), weights))
    return found


def reevaluation_table(first: List[dict], further: List[dict], count: int,
                       val_images: int) -> str:
    """A markdown table per contender: AP mean, sample std and per-seed values on the
    benchmark's validation images (`first`, results.jsonl records) and on `count` further
    ones (`further`, records of ``reevaluate``), over the seeds present in both."""
    rows = [f"| contender | seeds | AP on the first {val_images} (mean / std) | AP on {count} "
            f"further (mean / std) | per seed, first -> further |", "|---|---|---|---|---|"]
    for name in dict.fromkeys(r["contender"] for r in further):
        pairs = sorted((f["seed"], r["AP"], f["AP"]) for f in further if f["contender"] == name
                       for r in first if r["contender"] == name and r["seed"] == f["seed"])
        if not pairs:
            continue
        a, b = [p[1] for p in pairs], [p[2] for p in pairs]
        std = lambda v: f"{statistics.stdev(v):.1f}" if len(v) > 1 else "n/a"  # noqa: E731
        rows.append(f"| {name} | {','.join(str(p[0]) for p in pairs)} | "
                    f"{statistics.mean(a):.1f} / {std(a)} | {statistics.mean(b):.1f} / {std(b)} | "
                    + ", ".join(f"{x:.1f} -> {y:.1f}" for _, x, y in pairs) + " |")
    return "\n".join(rows)


def reevaluate(runs: List[tuple], *, build: Callable, evaluate: Callable,
               dataset_name: str, results_file: Path) -> List[dict]:
    """Scores each (contender, seed, weights) of `runs` not yet in `results_file` (JSON
    lines) on `dataset_name`: ``build(name, seed, dataset_name)`` gives (model, cfg),
    ``evaluate(model, cfg)`` the metrics. Appends and returns every record of the file."""
    import torch

    records = load_results(results_file)
    done = {(r["contender"], r["seed"], r["dataset"]) for r in records}
    for name, seed, weights in runs:
        if (name, seed, dataset_name) in done:
            continue
        model, cfg = build(name, seed, dataset_name)
        model.load_state_dict(torch.load(weights, map_location="cpu"))
        record: Dict = {"contender": name, "seed": seed, "dataset": dataset_name,
                        **evaluate(model, cfg)}
        print(json.dumps(record), flush=True)
        with open(results_file, "a") as f:
            f.write(json.dumps(record) + "\n")
        records.append(record)
    return [r for r in records if r["dataset"] == dataset_name]
