"""demo/demo.py: pictures and JSON files of detections, and a clear error for a bad input."""
import json
import subprocess
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances
from PIL import Image

from fcos_d2 import add_fcos_config
from fcos_d2.data import synthetic
from fcos_d2.visualization import detections_to_dicts

REPO = Path(__file__).resolve().parents[2]
# The quickstart model made tiny; every candidate kept, so random weights still detect.
TINY_MODEL = ["MODEL.FPN.OUT_CHANNELS", "64", "MODEL.FCOS.NUM_CONVS", "1",
              "MODEL.FCOS.INFERENCE_TH_TEST", "0.0", "TEST.DETECTIONS_PER_IMAGE", "5",
              "MODEL.DEVICE", "cpu"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart.yaml"))
    cfg.merge_from_list(TINY_MODEL)
    path = tmp_path_factory.mktemp("weights") / "model.pth"
    torch.manual_seed(0)  # some random weights predict only empty boxes: pick ones that do not
    torch.save({"model": build_model(cfg).state_dict()}, path)
    return path


def demo(scripts, weights: Path, output: Path, *inputs: Path) -> subprocess.CompletedProcess:
    return scripts.run("demo/demo.py", "--config-file", "configs/quickstart.yaml",
                       "--input", *map(str, inputs), "--output", str(output),
                       "--confidence-threshold", "0", *TINY_MODEL, "MODEL.WEIGHTS", str(weights),
                       timeout=240)


def test_demo_writes_a_picture_and_a_json_of_detections_per_image(scripts, weights, tmp_path):
    inputs = [tmp_path / "shapes_a.png", tmp_path / "shapes_b.jpg"]
    for index, path in enumerate(inputs):
        Image.fromarray(synthetic.render_image(seed=7, index=index)[0]).save(path)

    run = demo(scripts, weights, tmp_path / "out", *inputs)

    assert run.returncode == 0, run.stderr[-5000:]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "shapes_a.json", "shapes_a.png", "shapes_b.json", "shapes_b.png"]
    for path in inputs:
        # 128-px images are drawn 4x larger, so that labels stay legible
        assert Image.open(tmp_path / "out" / f"{path.stem}.png").size == (512, 512)
        record = json.loads((tmp_path / "out" / f"{path.stem}.json").read_text())
        assert (record["image"], record["height"], record["width"]) == (str(path), 128, 128)
        assert 1 <= len(record["detections"]) <= 5  # TEST.DETECTIONS_PER_IMAGE (then NMS)
        for detection in record["detections"]:
            x0, y0, x1, y1 = detection["box_xyxy"]
            assert 0 <= x0 <= x1 <= 128 and 0 <= y0 <= y1 <= 128
            assert 0 <= detection["score"] <= 1
            assert detection["class_name"] == synthetic.CLASS_NAMES[detection["class_id"]]


def test_demo_names_the_input_it_cannot_read(scripts, weights, tmp_path):
    missing = tmp_path / "no_such_image.jpg"
    run = demo(scripts, weights, tmp_path / "out", missing)
    assert run.returncode != 0
    assert f"demo.py: cannot read --input image '{missing}'" in run.stderr


def test_detections_become_dicts_with_xyxy_box_score_and_class_name():
    instances = Instances((20, 30), pred_boxes=Boxes(torch.tensor([[1.0, 2.0, 11.0, 12.5]])),
                          scores=torch.tensor([0.75]), pred_classes=torch.tensor([1]))
    assert detections_to_dicts(instances, ["cat", "dog"]) == [
        {"box_xyxy": [1.0, 2.0, 11.0, 12.5], "score": 0.75, "class_id": 1, "class_name": "dog"}]
    assert detections_to_dicts(instances, None)[0]["class_name"] == "1"  # no names: the id


def test_an_image_without_detections_gives_an_empty_list():
    empty = Instances((20, 30), pred_boxes=Boxes(torch.zeros(0, 4)), scores=torch.zeros(0),
                      pred_classes=torch.zeros(0, dtype=torch.int64))
    assert detections_to_dicts(empty, ["cat"]) == []
