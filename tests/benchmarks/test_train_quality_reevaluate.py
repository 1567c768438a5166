"""benchmarks.train_quality.reevaluate: stored runs scored again on further validation
images (``python -m benchmarks.train_quality --reevaluate N``)."""
import json

import pytest
import torch

from benchmarks.train_quality import cli
from benchmarks.train_quality.reevaluate import (further_images, reevaluate,
                                                 reevaluation_table, stored_runs)


def _coco(num_images):
    return {"images": [{"id": i} for i in range(1, num_images + 1)],
            "annotations": [{"id": 10 + i, "image_id": i} for i in (1, 2, 2, 3)],
            "categories": [{"id": 1, "name": "a"}]}


def test_further_images_drop_the_first_images_and_their_annotations():
    coco = _coco(4)
    coco["images"].reverse()  # by id, not by position in the file
    further = further_images(coco, 2)
    assert sorted(im["id"] for im in further["images"]) == [3, 4]
    assert [a["image_id"] for a in further["annotations"]] == [3]
    assert further["categories"] == coco["categories"]
    with pytest.raises(ValueError, match="holds 4 images, none after the first 4"):
        further_images(coco, 4)


@pytest.mark.parametrize("generator", ["shapes", "thin"])
def test_a_longer_split_starts_with_the_shorter_one(tmp_path, generator):
    """What makes the further images new: image i depends on (split seed, i) alone."""
    from fcos_d2.data import synthetic, synthetic_thin

    write = {"shapes": synthetic.write_split, "thin": synthetic_thin.write_thin_split}[generator]
    write(tmp_path / "short", split="val", num_images=2)
    write(tmp_path / "long", split="val", num_images=3)
    short, long = (json.loads((tmp_path / n / synthetic.ANNOTATIONS_FILE).read_text())
                   for n in ("short", "long"))
    assert long["images"][:2] == short["images"]
    assert [a for a in long["annotations"] if a["image_id"] <= 2] == short["annotations"]
    for name in ("000000.png", "000001.png"):
        assert (tmp_path / "long" / synthetic.IMAGES_FOLDER / name).read_bytes() == \
            (tmp_path / "short" / synthetic.IMAGES_FOLDER / name).read_bytes()


def test_stored_runs_are_the_folders_with_weights(tmp_path):
    for folder in ("fcos-d2 recipe-0", "fcos-d2 recipe-3", "detectron2-1", "no-seed"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model_final.pth").write_bytes(b"x")
    (tmp_path / "detectron2-2").mkdir()  # a run that did not finish
    assert [(n, s) for n, s, _ in stored_runs(tmp_path)] == [
        ("detectron2", 1), ("fcos-d2 recipe", 0), ("fcos-d2 recipe", 3)]
    assert [(n, s) for n, s, _ in stored_runs(tmp_path, ["detectron2"])] == [("detectron2", 1)]


def test_reevaluate_scores_each_run_once_and_keeps_the_records(tmp_path):
    weights = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        path = tmp_path / f"w{seed}.pth"
        torch.save(torch.nn.Linear(2, 1).state_dict(), path)
        weights.append(("m", seed, path))
    built = []

    def build(name, seed, dataset):
        built.append((name, seed, dataset))
        return torch.nn.Linear(2, 1), None

    def evaluate(model, cfg):  # the AP is the loaded bias, to see the weights were loaded
        return {"AP": float(model.bias.detach()), "AP50": 0.0}

    results = tmp_path / "re.jsonl"
    first = reevaluate(weights[:1], build=build, evaluate=evaluate, dataset_name="d",
                       results_file=results)
    records = reevaluate(weights, build=build, evaluate=evaluate, dataset_name="d",
                         results_file=results)
    assert built == [("m", 0, "d"), ("m", 1, "d")]  # seed 0 was not scored twice
    assert [r["seed"] for r in records] == [0, 1] and records[0] == first[0]
    for record, (_, _, path) in zip(records, weights):
        assert record["AP"] == pytest.approx(float(torch.load(path)["bias"]))
    assert len(results.read_text().splitlines()) == 2


def test_the_table_pairs_each_seed_on_both_sets():
    first = [{"contender": "a", "seed": s, "AP": ap} for s, ap in ((0, 10.0), (1, 14.0), (2, 9.0))]
    further = [{"contender": "a", "seed": 0, "AP": 9.0}, {"contender": "a", "seed": 1, "AP": 13.0}]
    table = reevaluation_table(first, further, 500, 100).splitlines()
    assert table[0].startswith("| contender | seeds | AP on the first 100 (mean / std) | "
                               "AP on 500 further")
    # seeds in both only: mean 12.0, std of (10, 14) = 2.83; further 11.0, std 2.83
    assert table[2] == "| a | 0,1 | 12.0 / 2.8 | 11.0 / 2.8 | 10.0 -> 9.0, 14.0 -> 13.0 |"


def test_the_option_is_parsed():
    args = cli._parser().parse_args(["--regime", "thin", "--reevaluate", "500"])
    assert args.reevaluate == 500 and args.regime == "thin"
