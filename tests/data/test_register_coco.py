"""Custom COCO-format datasets: registration, loading, clear errors, class count check."""
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fcos_d2  # noqa: F401  (compat shims before detectron2)
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.structures import BoxMode

from fcos_d2.data import check_num_classes, register_coco_dataset, synthetic

IMAGES = {5: "first.png", 9: "second.png", 17: "a/b.png"}  # image id -> file name


@pytest.fixture
def coco_dir(tmp_path) -> Path:
    """A 3-image COCO dataset with 2 categories (ids 1 and 2) in `tmp_path`."""
    for file_name in IMAGES.values():
        path = tmp_path / "images" / file_name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((24, 32, 3), 90, dtype=np.uint8)).save(path)
    coco = {
        "images": [{"id": i, "file_name": f, "height": 24, "width": 32} for i, f in IMAGES.items()],
        "annotations": [
            {"id": 1, "image_id": 5, "category_id": 1, "bbox": [2, 3, 10, 8], "area": 80,
             "iscrowd": 0},
            {"id": 2, "image_id": 17, "category_id": 2, "bbox": [0, 0, 4, 4], "area": 16,
             "iscrowd": 0},
        ],
        "categories": [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}],
    }
    (tmp_path / "annotations.json").write_text(json.dumps(coco))
    return tmp_path


@pytest.fixture
def name(request):
    """A dataset name unique to the test, unregistered afterwards."""
    dataset = f"custom_{request.node.name}"
    yield dataset
    if dataset in DatasetCatalog.list():
        DatasetCatalog.remove(dataset)
    if dataset in MetadataCatalog.list():
        MetadataCatalog.remove(dataset)


def _register(name: str, coco_dir: Path) -> None:
    register_coco_dataset(name, str(coco_dir / "annotations.json"), str(coco_dir / "images"))


def test_registered_dataset_loads_as_detectron2_dicts_with_0_based_classes(name, coco_dir):
    _register(name, coco_dir)
    dicts = DatasetCatalog.get(name)
    assert [d["image_id"] for d in dicts] == [5, 9, 17]
    assert dicts[2]["file_name"] == str(coco_dir / "images/a/b.png")
    assert [len(d["annotations"]) for d in dicts] == [1, 0, 1]
    first, last = dicts[0]["annotations"][0], dicts[2]["annotations"][0]
    assert first["bbox"] == [2, 3, 10, 8] and first["bbox_mode"] == BoxMode.XYWH_ABS
    assert (first["category_id"], last["category_id"]) == (0, 1)
    metadata = MetadataCatalog.get(name)
    assert metadata.thing_classes == ["cat", "dog"]
    assert metadata.evaluator_type == "coco"
    assert metadata.json_file == str(coco_dir / "annotations.json")
    assert metadata.image_root == str(coco_dir / "images")


def test_missing_json_file_is_an_error_naming_dataset_and_file(name, coco_dir):
    missing = str(coco_dir / "nope.json")
    with pytest.raises(FileNotFoundError, match=f"dataset '{name}': annotation file .*nope.json"):
        register_coco_dataset(name, missing, str(coco_dir / "images"))
    assert name not in DatasetCatalog.list() and name not in MetadataCatalog.list()


def test_missing_image_dir_is_an_error_naming_dataset_and_folder(name, coco_dir):
    with pytest.raises(FileNotFoundError, match=f"dataset '{name}': image directory .*pics"):
        register_coco_dataset(name, str(coco_dir / "annotations.json"), str(coco_dir / "pics"))
    assert name not in DatasetCatalog.list() and name not in MetadataCatalog.list()


def test_registering_a_taken_name_is_an_error_naming_it(name, coco_dir):
    _register(name, coco_dir)
    with pytest.raises(ValueError, match=f"dataset '{name}' is already registered"):
        _register(name, coco_dir)
    with pytest.raises(ValueError, match="'synthetic_shapes_train' is already registered"):
        _register("synthetic_shapes_train", coco_dir)


def test_missing_image_file_is_an_error_naming_the_file_and_image_id(name, coco_dir):
    _register(name, coco_dir)
    (coco_dir / "images/a/b.png").unlink()
    expected = (f"dataset '{name}': image file a/b.png not found in .*images "
                r"\(listed in .*annotations.json, image id 17\)$")
    with pytest.raises(FileNotFoundError, match=expected):
        DatasetCatalog.get(name)


def test_missing_image_files_error_counts_the_others(name, coco_dir):
    _register(name, coco_dir)
    (coco_dir / "images/first.png").unlink()
    (coco_dir / "images/a/b.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"first.png .*image id 5\); 1 more images"):
        DatasetCatalog.get(name)


def test_check_num_classes_loads_the_dataset_to_learn_its_classes(name, coco_dir):
    _register(name, coco_dir)
    assert MetadataCatalog.get(name).get("thing_classes") is None
    check_num_classes([name], 2)
    assert MetadataCatalog.get(name).thing_classes == ["cat", "dog"]


def test_check_num_classes_mismatch_names_dataset_both_numbers_and_config_key(name, coco_dir):
    _register(name, coco_dir)
    expected = f"dataset '{name}' has 2 classes but MODEL.FCOS.NUM_CLASSES is 80"
    with pytest.raises(ValueError, match=expected):
        check_num_classes([name], 80)
    with pytest.raises(ValueError, match="MODEL.FCOS.NUM_CLASSES 2"):
        check_num_classes(name, 80)  # a single name works too


def test_check_num_classes_of_synthetic_sets_generates_nothing(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("generation started")

    monkeypatch.setattr(synthetic, "write_split", fail)
    check_num_classes(["synthetic_shapes_train", "synthetic_shapes_val"], 6)
    with pytest.raises(ValueError, match="'synthetic_shapes_train' has 6 classes .* is 5"):
        check_num_classes(("synthetic_shapes_train",), 5)
