"""The modes of the training-quality command that train nothing: stored runs scored on
further validation images (``--reevaluate``), their weight growth (``--weight-growth``),
and where each contender's assignment puts the positives (``--positives``)."""
import json
from pathlib import Path
from typing import List, Optional

from benchmarks.train_quality import protocol
from benchmarks.train_quality.catalog import build_contender, contender_cfg
from benchmarks.train_quality.results import checked_results


def reevaluate_runs(regime: str, output: Path, count: int,
                    contenders: Optional[List[str]] = None) -> str:
    """Scores the runs stored under `output` on the `count` validation images of `regime`
    after its first ones (``benchmarks.train_quality.reevaluate``); returns the table of
    both scores."""
    import fcos_d2  # noqa: F401  (before detectron2)
    import torch
    from fcos_d2.data import register_coco_dataset
    from fcos_d2.data.synthetic import ANNOTATIONS_FILE, IMAGES_FOLDER

    from benchmarks.train_quality.reevaluate import (EXTRA_VAL_NAME, further_images,
                                                     reevaluate, reevaluation_table,
                                                     stored_runs)

    torch.set_num_threads(1)
    protocol.register_datasets(regime)
    (_, val_split, val_count) = protocol.REGIMES[regime].datasets[1]
    folder = protocol.ensure_split(regime, val_split, val_count + count)
    name = EXTRA_VAL_NAME.format(regime=regime, count=count)
    coco = json.loads((folder / ANNOTATIONS_FILE).read_text())
    annotations = output / f"{name}.json"
    annotations.write_text(json.dumps(further_images(coco, val_count)))
    register_coco_dataset(name, str(annotations), str(folder / IMAGES_FOLDER))

    def build(contender: str, seed: int, dataset: str):
        cfg = contender_cfg(contender, seed, str(output / "runs" / f"{contender}-{seed}"),
                            ["DATASETS.TEST", (dataset,)], regime=regime)
        return build_contender(contender, cfg), cfg

    further = reevaluate(stored_runs(output / "runs", contenders), build=build,
                         evaluate=protocol.evaluate, dataset_name=name,
                         results_file=output / "reevaluated.jsonl")
    return reevaluation_table(checked_results(output / "results.jsonl", regime), further,
                              count, val_count)


def weight_growth_runs(output: Path, contenders: Optional[List[str]] = None) -> str:
    """The weight growth per backbone stage of the runs stored under `output`
    (``benchmarks.train_quality.diagnostics.weight_growth_table``)."""
    from benchmarks.train_quality.diagnostics import weight_growth_table
    from benchmarks.train_quality.reevaluate import stored_runs

    results = [json.loads(line) for line in open(output / "results.jsonl")]
    return weight_growth_table(stored_runs(output / "runs", contenders), results)


def positives_table(regime: str, contenders: List[str]) -> str:
    """Where the assignment of each fcos-d2 contender puts the positives of the regime's
    training images (``diagnostics.positives_per_level``; no training)."""
    import torch
    from detectron2.data import DatasetCatalog
    from detectron2.structures import Boxes, Instances

    from benchmarks.train_quality.diagnostics import positives_per_level

    def assigner(model):
        if list(model.strides) != [8, 16, 32, 64, 128]:  # the table's P3-P7
            return None

        def matched(locations, boxes):
            instances = Instances((1, 1), gt_boxes=Boxes(boxes),
                                  gt_classes=torch.zeros(len(boxes), dtype=torch.int64))
            return model.targets(locations, [instances])[2][0]  # (R,)
        return matched

    protocol.register_datasets(regime)
    assigners = {name: assigner(build_contender(name, contender_cfg(name, 0, "unused",
                                                                    regime=regime)))
                 for name in contenders}
    train_name = protocol.REGIMES[regime].datasets[0][0]
    return positives_per_level(DatasetCatalog.get(train_name), assigners)
