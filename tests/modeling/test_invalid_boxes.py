"""Boxes with NaN or infinite coordinates, zero or negative size, or no overlap with their
image are dropped when a dataset is loaded, with one warning per load that counts them and
names the first; training never sees them."""
import json
import logging

import numpy as np
import pytest
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.structures import BoxMode
from PIL import Image

from fcos_d2 import add_fcos_config
from fcos_d2.data.boxes import box_defects, drop_invalid_boxes, filter_invalid_boxes_on_load
from fcos_d2.data.register import register_coco_dataset

NAN, INF = float("nan"), float("inf")
XYWH, XYXY = int(BoxMode.XYWH_ABS), int(BoxMode.XYXY_ABS)
VALID, NON_FINITE, EMPTY, OUTSIDE = -1, 0, 1, 2  # box_defects' values


@pytest.fixture
def warnings_logged():
    """The messages of the warnings fcos_d2.data.boxes logs during the test."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("fcos_d2.data.boxes")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


@pytest.fixture
def name(request):
    """A dataset name unique to the test, unregistered afterwards."""
    dataset = f"boxes_{request.node.name}"
    yield dataset
    for catalog in (DatasetCatalog, MetadataCatalog):
        if dataset in catalog.list():
            catalog.remove(dataset)


def test_box_defects_by_rule_on_a_20_wide_10_high_image():
    boxes = np.array([
        [2, 3, 4, 5],  # valid XYWH
        [NAN, 3, 4, 5], [0, 0, INF, 5], [-INF, 0, 1, 1],  # non-finite
        [2, 3, 0, 5], [2, 3, 4, -1],  # zero width, negative height
        [20, 0, 5, 5], [0, -8, 5, 8], [-6, 2, 5, 2],  # right of, above, left of the image
        [19, 9, 30, 30],  # 1 x 1 px inside: valid
        [5, 5, 5, 9], [5, 5, 4, 9], [1, 1, 19, 9],  # XYXY: zero width, negative, valid
        [NAN, -1, -1, -1],  # non-finite comes first
    ], dtype=float)
    modes = np.array([XYWH] * 10 + [XYXY] * 3 + [XYWH])
    sizes = np.tile([10.0, 20.0], (len(boxes), 1))  # (height, width)
    assert box_defects(boxes, modes, sizes).tolist() == [
        VALID, NON_FINITE, NON_FINITE, NON_FINITE, EMPTY, EMPTY, OUTSIDE, OUTSIDE, OUTSIDE,
        VALID, EMPTY, EMPTY, VALID, NON_FINITE]


def test_box_defects_without_image_size_skip_only_the_outside_check():
    boxes = np.array([[500, 500, 4, 4], [500, 500, 0, 4]], dtype=float)
    unknown = np.full((2, 2), NAN)
    assert box_defects(boxes, np.array([XYWH, XYWH]), unknown).tolist() == [VALID, EMPTY]


def box(*xywh, category=0):
    return {"bbox": list(xywh), "bbox_mode": BoxMode.XYWH_ABS, "category_id": category}


def test_drop_invalid_boxes_keeps_images_and_valid_boxes_and_warns_once(warnings_logged):
    dicts = [
        {"file_name": "a.png", "image_id": 3, "height": 10, "width": 20,
         "annotations": [box(1, 1, 5, 5), box(0, 0, NAN, 2), box(30, 0, 5, 5, category=1)]},
        {"file_name": "b.png", "image_id": 4, "height": 10, "width": 20, "annotations": []},
        {"file_name": "c.png", "image_id": 9, "height": 10, "width": 20,
         "annotations": [box(2, 2, 0, 0), box(2, 2, 3, 3, category=2)]},
    ]
    kept = drop_invalid_boxes(dicts, "toy")
    assert [d["image_id"] for d in kept] == [3, 4, 9]
    assert [[a["bbox"] for a in d["annotations"]] for d in kept] == [
        [[1, 1, 5, 5]], [], [[2, 2, 3, 3]]]
    assert len(dicts[0]["annotations"]) == 3  # the input is not modified
    assert kept[1] is dicts[1]  # untouched images are not copied
    [warning] = [r.getMessage() for r in warnings_logged]
    assert warning == (
        "dataset 'toy': dropped 3 of 5 boxes that cannot be trained on (1 with non-finite "
        "coordinates, 1 with zero or negative size, 1 entirely outside the image); the "
        "first: image file a.png (image id 3, size 20x10), box [0, 0, nan, 2] (XYWH_ABS) "
        "with non-finite coordinates")


def test_drop_invalid_boxes_of_a_clean_dataset_returns_it_without_warning(warnings_logged):
    dicts = [{"file_name": "a.png", "image_id": 1, "height": 10, "width": 20,
              "annotations": [box(1, 1, 5, 5)]}]
    assert drop_invalid_boxes(dicts, "clean") is dicts
    assert drop_invalid_boxes([], "empty") == []
    assert warnings_logged == []


def test_missing_or_none_coordinates_count_as_non_finite(warnings_logged):
    dicts = [{"file_name": "a.png", "image_id": 1, "height": 10, "width": 20,
              "annotations": [box(1, None, 5, 5), {"bbox": [1, 2, 3], "category_id": 0}]}]
    assert drop_invalid_boxes(dicts, "toy")[0]["annotations"] == []
    assert "(2 with non-finite coordinates)" in warnings_logged[0].getMessage()


def write_coco(folder, annotations):
    """A COCO dataset of one 32 x 24 image (id 5, 'img.png') and one category in `folder`."""
    (folder / "images").mkdir()
    Image.fromarray(np.full((24, 32, 3), 90, dtype=np.uint8)).save(folder / "images/img.png")
    coco = {"images": [{"id": 5, "file_name": "img.png", "height": 24, "width": 32}],
            "annotations": [{"id": i + 1, "image_id": 5, "category_id": 1, "bbox": bbox,
                             "area": 1, "iscrowd": 0} for i, bbox in enumerate(annotations)],
            "categories": [{"id": 1, "name": "thing"}]}
    (folder / "annotations.json").write_text(json.dumps(coco))  # NaN, Infinity as JSON allows
    return folder


def test_register_coco_dataset_drops_invalid_boxes_and_warns_once(tmp_path, name, warnings_logged):
    folder = write_coco(tmp_path, [[1, 1, 8, 8], [NAN, 1, 8, 8], [0, 0, INF, 5], [40, 0, 5, 5]])
    register_coco_dataset(name, str(folder / "annotations.json"), str(folder / "images"))
    [image] = DatasetCatalog.get(name)
    assert [a["bbox"] for a in image["annotations"]] == [[1, 1, 8, 8]]
    assert DatasetCatalog.get(name)[0]["annotations"] == image["annotations"]
    [warning] = warnings_logged  # the same warning once, however often the dataset loads
    message = warning.getMessage()
    assert message.startswith(f"dataset '{name}': dropped 3 of 4 boxes")
    assert f"image file {folder / 'images/img.png'} (image id 5, size 32x24)" in message


def test_filter_invalid_boxes_on_load_wraps_any_registered_dataset_once(name, warnings_logged):
    calls = []

    def load():
        calls.append(1)
        return [{"file_name": "x.png", "image_id": 1, "height": 8, "width": 8,
                 "annotations": [box(0, 0, -2, 2), box(1, 1, 2, 2)]}]

    DatasetCatalog.register(name, load)
    MetadataCatalog.get(name).set(thing_classes=["thing"])
    filter_invalid_boxes_on_load(name)
    filter_invalid_boxes_on_load(name)  # a second call does not wrap it again
    assert [a["bbox"] for a in DatasetCatalog.get(name)[0]["annotations"]] == [[1, 1, 2, 2]]
    assert len(calls) == 1 and len(warnings_logged) == 1
    assert MetadataCatalog.get(name).thing_classes == ["thing"]


def test_training_batches_never_contain_the_dropped_boxes(tmp_path, name):
    from fcos_d2.engine.trainer import Trainer

    folder = write_coco(tmp_path, [[1, 1, 8, 8], [NAN, 1, 8, 8], [0, 0, INF, 5], [0, 0, 0, 5],
                                   [33, 2, 5, 5], [4, 6, 10, 12]])
    register_coco_dataset(name, str(folder / "annotations.json"), str(folder / "images"))
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_list(["DATASETS.TRAIN", (name,), "SOLVER.IMS_PER_BATCH", 1,
                         "DATALOADER.NUM_WORKERS", 0, "INPUT.MIN_SIZE_TRAIN", (24,),
                         "INPUT.RANDOM_FLIP", "none"])
    [item] = next(iter(Trainer.build_train_loader(cfg)))
    boxes = item["instances"].gt_boxes.tensor  # (2, 4) XYXY
    assert boxes.tolist() == [[1, 1, 9, 9], [4, 6, 14, 18]]
