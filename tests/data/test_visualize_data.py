"""tools/visualize_data.py: the ground truth drawn on the images, as stored and as the training
loader delivers them, with category names; masks where the annotations have them."""
import importlib.util
import json
import uuid
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[2]


def tool():
    spec = importlib.util.spec_from_file_location("visualize_data",
                                                  REPO / "tools" / "visualize_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(dataset_json: Path, images: Path, output: Path, source: str, *extra: str):
    script, name = tool(), f"vis_{uuid.uuid4().hex[:6]}"
    args = script.argument_parser().parse_args([
        "--config-file", str(REPO / "configs/quickstart.yaml"), "--source", source,
        "--output", str(output), "--register-coco", name, str(dataset_json), str(images),
        "--dataset", name, *extra])
    return [Path(p) for p in script.main(args)]


def test_annotations_are_drawn_on_each_image_as_stored_with_category_names(dataset, tmp_path):
    written = run(dataset / "annotations.json", dataset / "images", tmp_path / "vis", "annotation")
    coco = json.loads((dataset / "annotations.json").read_text())
    assert sorted(p.name for p in written) == sorted(
        Path(i["file_name"]).stem + ".png" for i in coco["images"])
    first = coco["images"][0]
    original = np.asarray(Image.open(dataset / "images" / first["file_name"]).convert("RGB"))
    picture = np.asarray(Image.open(tmp_path / "vis" / (Path(first["file_name"]).stem + ".png")))
    assert picture.shape == (512, 512 * original.shape[1] // original.shape[0], 3)  # enlarged
    upscaled = np.asarray(Image.fromarray(original).resize(picture.shape[1::-1]))
    assert np.abs(picture.astype(int) - upscaled).max() > 100  # boxes and labels drawn


def test_masks_are_drawn_where_the_annotations_have_segmentations(dataset, tmp_path):
    coco = json.loads((dataset / "annotations.json").read_text())
    for annotation in coco["annotations"]:  # a triangle in the box's upper-left half
        x, y, w, h = annotation["bbox"]
        annotation["segmentation"] = [[x, y, x + w, y, x, y + h]]
    with_masks = tmp_path / "with_masks.json"
    with_masks.write_text(json.dumps(coco))
    plain = run(dataset / "annotations.json", dataset / "images", tmp_path / "plain", "annotation",
                "--num-images", "1")
    masked = run(with_masks, dataset / "images", tmp_path / "masked", "annotation",
                 "--num-images", "1")
    x, y, w, h = (v * 4 for v in coco["annotations"][0]["bbox"])  # 128 px -> 512 px
    inside = (slice(int(y + h / 4), int(y + h / 3)), slice(int(x + w / 4), int(x + w / 3)))
    difference = np.abs(np.asarray(Image.open(masked[0]), dtype=int)[inside]
                        - np.asarray(Image.open(plain[0]), dtype=int)[inside])
    assert difference.mean() > 10  # the mask's colour over the inside of the triangle


def test_the_dataloader_source_draws_the_augmented_training_images(dataset, tmp_path):
    written = run(dataset / "annotations.json", dataset / "images", tmp_path / "loader",
                  "dataloader", "--num-images", "3", "INPUT.MIN_SIZE_TRAIN", "(96,)",
                  "INPUT.MAX_SIZE_TRAIN", "96")
    assert [p.name[:5] for p in written] == ["0000_", "0001_", "0002_"]
    for path in written:
        assert Image.open(path).size == (512, 512)  # resized to 96 by the loader, then enlarged


def test_the_dataloader_labels_boxes_with_category_names(dataset, tmp_path, monkeypatch):
    from detectron2.utils.visualizer import Visualizer

    labels = []
    overlay = Visualizer.overlay_instances
    monkeypatch.setattr(Visualizer, "overlay_instances",
                        lambda self, **kw: labels.extend(kw["labels"]) or overlay(self, **kw))
    run(dataset / "annotations.json", dataset / "images", tmp_path / "loader", "dataloader",
        "--num-images", "2")
    coco = json.loads((dataset / "annotations.json").read_text())
    names = {category["name"] for category in coco["categories"]}
    assert labels and set(labels) <= names
