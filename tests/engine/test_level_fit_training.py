"""The level fit from a config's training data: the table logged as training starts, the
tool that prints it, and MODEL.FCOS.LEVELS_FROM_DATA (fcos_d2.engine.level_fit)."""
import importlib.util
import logging
from pathlib import Path

import pytest
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog
from detectron2.modeling import build_model
from detectron2.structures import BoxMode

from fcos_d2 import add_fcos_config
from fcos_d2.engine.level_fit import (apply_levels_from_data, fit_report, log_level_fit,
                                      training_images)

REPO = Path(__file__).resolve().parents[2]
NAME = "level_fit_hand_made"


def _records():
    # 10 images of 256x256, resized to 128: a 16-px box becomes 8 px, a 240x200 one 120x100
    return [{"file_name": f"{i}.png", "image_id": i, "height": 256, "width": 256,
             "annotations": [{"bbox": [8, 8, 16, 16], "bbox_mode": BoxMode.XYWH_ABS,
                              "category_id": 0},
                             {"bbox": [10, 40, 240, 200], "bbox_mode": BoxMode.XYWH_ABS,
                              "category_id": 1},
                             {"bbox": [0, 0, 256, 256], "bbox_mode": BoxMode.XYWH_ABS,
                              "category_id": 1, "iscrowd": 1}]} for i in range(10)]


@pytest.fixture(scope="module", autouse=True)
def hand_made_dataset():
    DatasetCatalog.register(NAME, _records)
    yield
    DatasetCatalog.remove(NAME)


def _cfg(*opts):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "FCOS-R18-small-data-P3-P7.yaml"))
    cfg.merge_from_list(["DATASETS.TRAIN", (NAME,), "MODEL.DEVICE", "cpu", *opts])
    return cfg


def test_boxes_are_resized_as_training_resizes_them_and_crowds_left_out():
    images = training_images(_cfg(), max_images=3)
    assert len(images) == 3 and (images[0].height, images[0].width) == (128, 128)
    assert images[0].boxes.tolist() == [[4, 4, 12, 12], [5, 20, 125, 120]]


def test_levels_from_data_set_the_levels_ranges_and_backbone_and_turn_themselves_off():
    cfg = _cfg("MODEL.FCOS.LEVELS_FROM_DATA", True)
    line = apply_levels_from_data(cfg)
    # 8-px objects: P2 spans them twice; 120-px ones reach 60 px, within P4's range
    assert list(cfg.MODEL.FCOS.IN_FEATURES) == ["p2", "p3", "p4"]
    assert list(cfg.MODEL.FCOS.SIZES_OF_INTEREST) == [16, 32]
    assert list(cfg.MODEL.RESNETS.OUT_FEATURES) == ["res2", "res3", "res4"]
    assert list(cfg.MODEL.FPN.IN_FEATURES) == ["res2", "res3", "res4"]
    assert cfg.MODEL.FCOS.TOP_BLOCKS_IN == "" and not cfg.MODEL.FCOS.LEVELS_FROM_DATA
    assert "levels ['p2', 'p3', 'p4']" in line and "20 boxes of 10 training images" in line
    assert build_model(cfg).strides == [4, 8, 16]  # the config builds
    assert apply_levels_from_data(cfg) is None  # off now: the saved config is final


def test_levels_from_data_refuse_a_backbone_they_cannot_set():
    cfg = _cfg("MODEL.FCOS.LEVELS_FROM_DATA", True, "MODEL.BACKBONE.NAME", "build_nas_fpn")
    with pytest.raises(ValueError, match="MODEL.BACKBONE.NAME build_nas_fpn"):
        apply_levels_from_data(cfg)


def test_training_start_logs_the_table_and_its_warnings(caplog):
    cfg = _cfg()
    with caplog.at_level(logging.INFO, logger="fcos_d2"):
        log_level_fit(cfg, build_model(cfg))
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"Level fit on {NAME} (10 images)" in m and "| < 16 | 10 |" in m for m in infos)
    # P3-P7 with the recipe's ranges: the 120-px boxes land on P5; the 8-px ones, between
    # P3's locations (4 and 12 px), get none
    assert any(m.startswith("Level fit: 50% of the objects get no positive location (< 16 px: "
                            "100%)") for m in warnings)
    assert any(m.startswith("Level fit: level(s) p3, p4, p6, p7 get no objects") for m in warnings)
    assert fit_report(_cfg("MODEL.FCOS.LEVEL_FIT_IMAGES", 0), build_model(cfg)) is None


def test_the_tool_prints_the_table_and_the_choice(capsys):
    spec = importlib.util.spec_from_file_location("analyze_data", REPO / "tools" / "analyze_data.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["--config-file", str(REPO / "configs" / "FCOS-R18-small-data-P3-P7.yaml"),
                      "--choose", "DATASETS.TRAIN", f"('{NAME}',)"]) == 0
    out = capsys.readouterr().out
    assert "levels p3, p4, p5, p6, p7 (strides 8, 16, 32, 64, 128)" in out
    assert "MODEL.FCOS.LEVELS_FROM_DATA: levels ['p2', 'p3', 'p4']" in out
    assert "levels p2, p3, p4 (strides 4, 8, 16)" in out
