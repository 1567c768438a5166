"""Instance masks in the data: the synthetic set with masks (``synthetic_masks_*``), mask
targets from COCO polygons and RLE through FCOSDatasetMapper's augmentations, and
``--register-coco`` datasets keeping their segmentations."""
import json
from pathlib import Path

import numpy as np
import pycocotools.mask as mask_util
import pytest
from PIL import Image

import fcos_d2  # noqa: F401  (compat shims before detectron2)
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data import transforms as T
from detectron2.structures import BitMasks, PolygonMasks

from fcos_d2 import add_fcos_config
from fcos_d2.data import prepare_dataset, register_coco_dataset, synthetic
from fcos_d2.data.mapper import FCOSDatasetMapper
from fcos_d2.data.masks import mask_to_rle

SEED = synthetic.SPLIT_SEEDS["val"]
HEIGHT, WIDTH = 20, 40  # the hand-made image; resized x2 to 40 x 80, then mirrored


# ---- the synthetic set with masks ------------------------------------------------------


@pytest.fixture(scope="module")
def masks_and_plain(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    synthetic.write_split(root / "masks", split="val", num_images=12, masks=True)
    synthetic.write_split(root / "plain", split="val", num_images=12)
    return [json.loads((root / f / "annotations.json").read_text()) for f in ("masks", "plain")]


def test_synthetic_masks_decode_exactly_to_the_visible_pixels_of_each_shape(masks_and_plain):
    annotations = masks_and_plain[0]["annotations"]
    checked = 0
    for index in range(12):
        objects = synthetic.render_image(seed=SEED, index=index)[1]
        mine = [a for a in annotations if a["image_id"] == index + 1]
        assert len(mine) == len(objects)
        for annotation, obj in zip(mine, objects):
            assert isinstance(annotation["segmentation"]["counts"], str)  # JSON-ready RLE
            decoded = mask_util.decode(annotation["segmentation"]).astype(bool)
            np.testing.assert_array_equal(decoded, obj.visible_mask)
            assert annotation["area"] == int(decoded.sum())
            assert annotation["bbox"] == list(synthetic.tight_box(decoded))
            checked += 1
    assert checked > 20


def test_synthetic_masks_are_the_detection_set_plus_segmentations(masks_and_plain):
    with_masks, plain = masks_and_plain
    without = [{k: v for k, v in a.items() if k != "segmentation"}
               for a in with_masks["annotations"]]
    assert without == plain["annotations"]
    assert with_masks["images"] == plain["images"]
    assert "segmentation" not in plain["annotations"][0]
    assert "synthetic_shapes_v2" in with_masks["info"]["description"]


def test_masks_set_lives_in_its_own_v2_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("FCOS_D2_DATASETS_CACHE", str(tmp_path))
    assert synthetic.datasets_cache_root(masks=True) == tmp_path / "synthetic_shapes_v2"
    assert synthetic.datasets_cache_root() == tmp_path / "synthetic_shapes_v1"
    split_dir = synthetic.ensure_synthetic_shapes("val", num_images=3, masks=True)
    assert split_dir == tmp_path / "synthetic_shapes_v2" / "val_3"
    coco = json.loads((split_dir / "annotations.json").read_text())
    assert all("segmentation" in a for a in coco["annotations"])


@pytest.fixture
def masks_registered_in_tmp(tmp_path, monkeypatch):
    """Registers the synthetic mask names afresh under a temporary cache with few images."""
    monkeypatch.setitem(synthetic.NUM_IMAGES, "train", 4)
    monkeypatch.setitem(synthetic.NUM_IMAGES, "val", 3)
    original = Path(MetadataCatalog.get("synthetic_masks_val").json_file).parents[1]
    _unregister_masks()
    synthetic.register_synthetic_shapes(masks_root=tmp_path / "v2")
    yield tmp_path / "v2"
    _unregister_masks()
    synthetic.register_synthetic_shapes(masks_root=original)


def _unregister_masks() -> None:
    for name in synthetic.MASK_DATASET_SPLITS:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def test_mask_names_load_with_an_rle_segmentation_per_annotation(masks_registered_in_tmp):
    dicts = DatasetCatalog.get("synthetic_masks_train")
    assert len(dicts) == 4
    annotations = [a for d in dicts for a in d["annotations"]]
    assert annotations and all(set(a["segmentation"]) == {"size", "counts"}
                               for a in annotations)
    metadata = MetadataCatalog.get("synthetic_masks_val")
    assert metadata.thing_classes == list(synthetic.CLASS_NAMES)
    assert metadata.json_file == str(masks_registered_in_tmp / "val/annotations.json")
    prepare_dataset("synthetic_masks_val")
    assert Path(metadata.json_file).is_file()


# ---- mask targets through the mapper ---------------------------------------------------


def _image_file(tmp_path: Path) -> str:
    path = tmp_path / "image.png"
    Image.fromarray(np.full((HEIGHT, WIDTH, 3), 90, dtype=np.uint8)).save(path)
    return str(path)


def _mapper(mask_format: str) -> FCOSDatasetMapper:
    """Resizes 20 x 40 images to 40 x 80 (x2) and always mirrors them."""
    return FCOSDatasetMapper(
        is_train=True, image_format="BGR", use_instance_mask=True,
        instance_mask_format=mask_format,
        augmentations=[T.ResizeShortestEdge(2 * HEIGHT, 1000), T.RandomFlip(prob=1.0)])


def _record(file_name: str, segmentations: list) -> dict:
    boxes = [[4, 4, 8, 8]] * len(segmentations)  # XYWH; unused by the masks
    return {"file_name": file_name, "image_id": 7, "height": HEIGHT, "width": WIDTH,
            "annotations": [{"bbox": box, "bbox_mode": 1, "category_id": 0, "iscrowd": 0,
                             "segmentation": s} for box, s in zip(boxes, segmentations)]}


SQUARE = [[4.0, 4.0, 12.0, 4.0, 12.0, 12.0, 4.0, 12.0]]  # pixels x, y in 4..11


def _expected_square() -> np.ndarray:
    """The square's pixels after x2 and the mirror: rows 8..23, columns 80-24..80-9."""
    mask = np.zeros((2 * HEIGHT, 2 * WIDTH), dtype=bool)
    mask[8:24, 56:72] = True
    return mask


def test_polygon_targets_are_resized_and_mirrored_polygon_masks(tmp_path):
    out = _mapper("polygon")(_record(_image_file(tmp_path), [SQUARE]))
    masks = out["instances"].gt_masks
    assert isinstance(masks, PolygonMasks)
    assert out["image"].shape == (3, 2 * HEIGHT, 2 * WIDTH)
    np.testing.assert_allclose(masks.polygons[0][0].reshape(-1, 2)[:, 0],
                               [72.0, 56.0, 56.0, 72.0])  # x -> 80 - 2x
    np.testing.assert_allclose(masks.polygons[0][0].reshape(-1, 2)[:, 1],
                               [8.0, 8.0, 24.0, 24.0])  # y -> 2y
    np.testing.assert_array_equal(
        BitMasks.from_polygon_masks(masks, 2 * HEIGHT, 2 * WIDTH).tensor[0].numpy(),
        _expected_square())


def test_polygon_targets_as_bitmasks_at_the_input_size(tmp_path):
    out = _mapper("bitmask")(_record(_image_file(tmp_path), [SQUARE]))
    masks = out["instances"].gt_masks
    assert isinstance(masks, BitMasks) and masks.tensor.shape == (1, 2 * HEIGHT, 2 * WIDTH)
    np.testing.assert_array_equal(masks.tensor[0].numpy(), _expected_square())


def _l_shape() -> np.ndarray:
    mask = np.zeros((HEIGHT, WIDTH), dtype=bool)
    mask[2:15, 3:6] = True
    mask[12:15, 3:20] = True
    return mask


@pytest.mark.parametrize("compressed", [True, False])
def test_rle_targets_are_resized_and_mirrored_bitmasks(tmp_path, compressed):
    rle = mask_to_rle(_l_shape())
    if not compressed:  # uncompressed RLE: run lengths as a list, as some exporters write
        rle = {"size": [HEIGHT, WIDTH], "counts": _run_lengths(_l_shape())}
        rle = mask_util.frPyObjects(rle, HEIGHT, WIDTH)  # as load_coco_json converts it
    out = _mapper("bitmask")(_record(_image_file(tmp_path), [rle]))
    masks = out["instances"].gt_masks
    expected = np.fliplr(np.kron(_l_shape(), np.ones((2, 2), dtype=bool)))  # x2, nearest
    np.testing.assert_array_equal(masks.tensor[0].numpy(), expected)
    # the box follows the transformed annotation box; the mask is what matters here
    assert out["instances"].gt_classes.tolist() == [0]


def _run_lengths(mask: np.ndarray) -> list:
    """COCO's uncompressed RLE counts: alternating 0- and 1-runs in column-major order."""
    flat = mask.flatten(order="F").astype(np.int8)
    changes = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], changes, [flat.size]])).tolist()
    return ([0] + runs) if flat[0] else runs


def test_rle_with_polygon_format_is_an_error_saying_to_use_bitmask(tmp_path):
    record = _record(_image_file(tmp_path), [mask_to_rle(_l_shape())])
    with pytest.raises(ValueError, match=r"image id 7\).*set INPUT.MASK_FORMAT bitmask"):
        _mapper("polygon")(record)


def test_annotation_without_segmentation_is_an_error_naming_the_image(tmp_path):
    record = _record(_image_file(tmp_path), [SQUARE])
    del record["annotations"][0]["segmentation"]
    with pytest.raises(ValueError, match=r"image\.png \(image id 7\) has no 'segmentation'"):
        _mapper("bitmask")(record)


@pytest.mark.parametrize("mask_format", ["polygon", "bitmask"])
def test_image_without_objects_gets_zero_masks(tmp_path, mask_format):
    out = _mapper(mask_format)(_record(_image_file(tmp_path), []))
    assert len(out["instances"]) == 0 and len(out["instances"].gt_masks) == 0


def test_config_mask_on_gives_gt_masks_and_unknown_mask_format_is_refused(tmp_path):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.MODEL.MASK_ON, cfg.INPUT.MASK_FORMAT = True, "bitmask"
    cfg.INPUT.MIN_SIZE_TRAIN, cfg.INPUT.RANDOM_FLIP = (2 * HEIGHT,), "none"
    out = FCOSDatasetMapper(cfg, is_train=True)(_record(_image_file(tmp_path), [SQUARE]))
    np.testing.assert_array_equal(out["instances"].gt_masks.tensor[0].numpy(),
                                  np.fliplr(_expected_square()))
    cfg.INPUT.MASK_FORMAT = "rle"
    with pytest.raises(ValueError, match="INPUT.MASK_FORMAT: unknown value 'rle'"):
        FCOSDatasetMapper(cfg, is_train=True)


# ---- --register-coco keeps segmentations ----------------------------------------------


def test_registered_coco_dataset_keeps_polygons_and_rle(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(np.zeros((HEIGHT, WIDTH, 3), dtype=np.uint8)).save(images / "a.png")
    rle = mask_to_rle(_l_shape())
    coco = {"images": [{"id": 1, "file_name": "a.png", "height": HEIGHT, "width": WIDTH}],
            "categories": [{"id": 1, "name": "thing"}],
            "annotations": [
                {"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 0, "area": 64,
                 "bbox": [4, 4, 8, 8], "segmentation": SQUARE},
                {"id": 2, "image_id": 1, "category_id": 1, "iscrowd": 0, "area": 81,
                 "bbox": [3, 2, 17, 13], "segmentation": rle}]}
    (tmp_path / "coco.json").write_text(json.dumps(coco))
    register_coco_dataset("masks_coco_test", str(tmp_path / "coco.json"), str(images))
    try:
        record = DatasetCatalog.get("masks_coco_test")[0]
    finally:
        DatasetCatalog.remove("masks_coco_test")
        MetadataCatalog.remove("masks_coco_test")
    segmentations = [a["segmentation"] for a in record["annotations"]]
    assert segmentations[0] == SQUARE and segmentations[1]["counts"] == rle["counts"]
    masks = _mapper("bitmask")(record)["instances"].gt_masks.tensor.numpy()
    np.testing.assert_array_equal(masks[0], _expected_square())
    np.testing.assert_array_equal(
        masks[1], np.fliplr(np.kron(_l_shape(), np.ones((2, 2), dtype=bool))))
