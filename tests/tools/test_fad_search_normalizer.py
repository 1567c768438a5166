"""tools/fad_search_normalizer.py: the search log's loss lines, the normalizer of two
forwards an iteration, the loss per positive, and the positives of a batch."""
import importlib.util
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.structures import Boxes, Instances

from fcos_d2 import add_fcos_config

TOOL = Path(__file__).resolve().parents[2] / "tools" / "fad_search_normalizer.py"
spec = importlib.util.spec_from_file_location("fad_search_normalizer", TOOL)
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)


def test_loss_lines_of_both_log_formats_are_read():
    log = ("[12/07 09:13:17 fcos_d2.fad]: iteration 10/200: mean loss 0.4221 over the last 10 "
           "iterations (batches of 4 images; the last 0.4695), lr 0.00180\n"
           "FAD search: 13/200 iterations (6%), loss=0.5616, mean_loss=0.4666\n"
           "[12/07 09:14:42 fcos_d2.fad]: iteration 20/200: mean loss 0.5568 over the last 10 "
           "iterations (the last batch 0.6257), lr 0.00380\n")
    assert tool.logged_losses(log) == [(10, 10, 0.4221), (20, 10, 0.5568)]


def test_the_normalizer_takes_the_architecture_batch_then_the_training_batch():
    # 100 -> 0.5 * 100 + 0.5 * 10 = 55 -> 37.5 (training batch: 20); then 23.75 -> 26.875
    assert tool.normalizer_values([(10, 20), (10, 30)], 100.0, 0.5) == [37.5, 26.875]


def test_the_loss_per_positive_rescales_each_window_by_its_normalizer_over_its_positives():
    rows = tool.per_positive([(2, 2, 0.5), (3, 1, 1.0)], [10, 30, 40], [100.0, 60.0, 40.0])
    assert [r["iterations"] for r in rows] == ["1-2", "3-3"]
    assert rows[0]["normalizer"] == 80.0 and rows[0]["positives"] == 20.0
    assert rows[0]["per_positive"] == pytest.approx(0.5 * 80 / 20)
    assert rows[1]["per_positive"] == pytest.approx(1.0)


def test_a_batch_counts_the_locations_the_fcos_assignment_makes_positive():
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.MODEL.FCOS.IN_FEATURES = ["p3"]  # one level, stride 8, every size
    cfg.MODEL.FCOS.SIZES_OF_INTEREST = []
    cfg.MODEL.FCOS.CENTER_SAMPLING_RADIUS = 1.0
    cfg.MODEL.FCOS.NUM_CLASSES = 2
    instances = Instances((32, 32))
    # a box over locations x, y in {4, 12, 20} (stride 8): within 1 stride of its center
    # (12, 12) lie 4 < x, y < 20 -> only (12, 12); the empty image adds nothing
    instances.gt_boxes, instances.gt_classes = Boxes(torch.tensor([[0.0, 0, 24, 24]])), \
        torch.tensor([1])
    empty = Instances((32, 32))
    empty.gt_boxes, empty.gt_classes = Boxes(torch.zeros(0, 4)), torch.zeros(0, dtype=torch.long)
    batch = [{"image": torch.zeros(3, 32, 32), "instances": instances},
             {"image": torch.zeros(3, 32, 32), "instances": empty}]
    assert tool.batch_positives(batch, cfg, divisor=32) == 1
