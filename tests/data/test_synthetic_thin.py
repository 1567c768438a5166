"""The synthetic thin-shapes set (second small-data regime): deterministic, 256-352 px
images, 10 classes of thin and filled objects of about 10-100 px, tight boxes."""
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fcos_d2  # noqa: F401  (compat shims before detectron2)
from detectron2.data import DatasetCatalog, MetadataCatalog

from fcos_d2.data import prepare_dataset, synthetic, synthetic_thin as thin

SAMPLE = 30  # val images the statistics below are measured on


@pytest.fixture(scope="module")
def val_sample(tmp_path_factory) -> Path:
    return thin.ensure_synthetic_thin("val", root=tmp_path_factory.mktemp("thin"),
                                      num_images=SAMPLE)


def _coco(split_dir: Path) -> dict:
    return json.loads((split_dir / "annotations.json").read_text())


def test_two_generations_give_identical_annotations_and_image_bytes(tmp_path):
    for folder in ("a", "b"):
        thin.write_thin_split(tmp_path / folder, split="train", num_images=3)
    assert (tmp_path / "a/annotations.json").read_bytes() == \
        (tmp_path / "b/annotations.json").read_bytes()
    for i in range(3):
        name = f"images/{i:06d}.png"
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_images_have_a_256_px_short_side_and_a_long_side_up_to_352(val_sample):
    coco = _coco(val_sample)
    for image in coco["images"]:
        short, long = sorted((image["height"], image["width"]))
        assert short == 256 and 256 <= long <= 352
        with Image.open(val_sample / "images" / image["file_name"]) as pixels:
            assert pixels.size == (image["width"], image["height"])
    assert len({(i["height"], i["width"]) for i in coco["images"]}) > 5  # sizes vary


def test_ten_classes_with_ids_1_to_10_and_boxes_of_about_10_to_100_px(val_sample):
    coco = _coco(val_sample)
    assert [c["name"] for c in coco["categories"]] == list(thin.CLASS_NAMES)
    assert [c["id"] for c in coco["categories"]] == list(range(1, 11))
    assert {a["category_id"] for a in coco["annotations"]} == set(range(1, 11))
    sides = np.array([max(a["bbox"][2:]) for a in coco["annotations"]])
    assert sides.min() >= thin.MIN_BOX_SIZE and sides.max() <= 101


def test_boxes_lie_in_their_image_and_are_tight_to_the_drawn_pixels(val_sample):
    coco = _coco(val_sample)
    sizes = {i["id"]: (i["height"], i["width"]) for i in coco["images"]}
    for image_id in (1, 2, 3):
        pixels, objects = thin.render_thin_image(seed=thin.SPLIT_SEEDS["val"], index=image_id - 1)
        boxes = [a["bbox"] for a in coco["annotations"] if a["image_id"] == image_id]
        assert boxes == [list(synthetic.tight_box(mask)) for _, mask in objects]
        assert pixels.shape[:2] == sizes[image_id]
    for a in coco["annotations"]:
        height, width = sizes[a["image_id"]]
        x, y, w, h = a["bbox"]
        assert 0 <= x and 0 <= y and x + w <= width and y + h <= height


def test_thin_classes_cover_a_small_share_of_their_box_and_filled_ones_most():
    def fill(kind):
        mask = thin.thin_shape_mask(kind, size=(120, 120), center=(60.0, 60.0), radius=35.0)
        x, y, w, h = synthetic.tight_box(mask)
        return mask.sum() / (w * h)

    assert thin.stroke_width(70.0) == 5 and thin.stroke_width(10.0) == 1
    for kind in ("ring", "square_outline", "triangle_outline", "plus", "hash", "seven", "four"):
        assert fill(kind) < 0.45, kind
    for kind in ("disc", "square"):
        assert fill(kind) > 0.75, kind


def test_unknown_split_is_an_error_naming_it(tmp_path):
    with pytest.raises(ValueError, match="'test'"):
        thin.ensure_synthetic_thin("test", root=tmp_path)


def test_registered_names_point_at_their_own_cache_folder():
    for folder, splits in ((thin.CACHE_FOLDER, thin.DATASET_SPLITS),
                           (thin.MASKS_CACHE_FOLDER, thin.MASK_DATASET_SPLITS)):
        for name, split in splits.items():
            assert name in DatasetCatalog.list()
            json_file = Path(MetadataCatalog.get(name).json_file)
            assert json_file.parent.name == split
            assert json_file.parent.parent.name == folder != synthetic.CACHE_FOLDER
            assert MetadataCatalog.get(name).thing_classes == list(thin.CLASS_NAMES)
    assert thin.CACHE_FOLDER != thin.MASKS_CACHE_FOLDER


@pytest.fixture
def thin_in_tmp(tmp_path, monkeypatch):
    """The thin names (with and without masks) registered afresh under a temporary cache
    with few images."""
    monkeypatch.setitem(thin.NUM_IMAGES, "train", 3)
    monkeypatch.setitem(thin.NUM_IMAGES, "val", 2)
    roots = {masks: Path(MetadataCatalog.get(name).json_file).parents[1]
             for masks, name in ((False, "synthetic_thin_val"),
                                 (True, "synthetic_thin_masks_val"))}
    _unregister()
    thin.register_synthetic_thin(root=tmp_path / thin.CACHE_FOLDER,
                                 masks_root=tmp_path / thin.MASKS_CACHE_FOLDER)
    yield tmp_path / thin.CACHE_FOLDER
    _unregister()
    thin.register_synthetic_thin(root=roots[False], masks_root=roots[True])


def _unregister() -> None:
    for name in [*thin.DATASET_SPLITS, *thin.MASK_DATASET_SPLITS]:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def test_prepare_dataset_generates_the_split_the_metadata_names_and_it_loads(thin_in_tmp):
    json_file = Path(MetadataCatalog.get("synthetic_thin_val").json_file)
    assert not json_file.exists()
    prepare_dataset("synthetic_thin_val")
    assert json_file.is_file() and len(json.loads(json_file.read_text())["images"]) == 2
    assert not (thin_in_tmp / "train").exists()
    dicts = DatasetCatalog.get("synthetic_thin_train")
    assert len(dicts) == 3 and all(min(d["height"], d["width"]) == 256 for d in dicts)
    assert {a["category_id"] for d in dicts for a in d["annotations"]} <= set(range(10))


def test_the_masks_twin_has_the_same_images_and_boxes_and_each_object_s_visible_pixels(
        thin_in_tmp):
    from pycocotools import mask as mask_util

    prepare_dataset("synthetic_thin_masks_val")
    masks_dir = Path(MetadataCatalog.get("synthetic_thin_masks_val").json_file).parent
    assert masks_dir.parent.name == thin.MASKS_CACHE_FOLDER
    assert not (thin_in_tmp / "val").exists()  # the box-only set is not written
    with_masks = _coco(masks_dir)
    for index, image in enumerate(with_masks["images"]):
        _, objects = thin.render_thin_image(seed=thin.SPLIT_SEEDS["val"], index=index)
        found = [a for a in with_masks["annotations"] if a["image_id"] == image["id"]]
        assert len(found) == len(objects)
        for annotation, (class_index, visible) in zip(found, objects):
            decoded = mask_util.decode(annotation["segmentation"]).astype(bool)
            assert np.array_equal(decoded, visible)
            assert annotation["bbox"] == list(synthetic.tight_box(visible))
            assert annotation["category_id"] == class_index + 1
    dicts = DatasetCatalog.get("synthetic_thin_masks_train")
    assert len(dicts) == 3
    assert all("segmentation" in a for d in dicts for a in d["annotations"])
