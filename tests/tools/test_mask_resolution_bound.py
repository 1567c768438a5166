"""tools/mask_resolution_bound.py: the caps table per preset and its record."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

TOOL = Path(__file__).resolve().parents[2] / "tools" / "mask_resolution_bound.py"
spec = importlib.util.spec_from_file_location("mask_resolution_bound", TOOL)
bound = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bound)


def one_stroke_image():
    """A 32 x 32 image with a one-pixel stroke (row 10, x 4-15) and a 10 x 10 square."""
    masks = torch.zeros(2, 32, 32, dtype=torch.bool)
    masks[0, 10, 4:16] = True
    masks[1, 18:28, 18:28] = True
    return [(masks, torch.tensor([[4.0, 10, 16, 11], [18, 18, 28, 28]]))]


def test_the_tool_prints_and_records_the_caps_per_preset(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bound, "load_images", lambda dataset: one_stroke_image())
    monkeypatch.setenv("FCOS_D2_RECORDS_DIR", str(tmp_path))
    tables = bound.main(["--presets", "official", "official, keep_peak", "--record"])
    # official: the stroke's target is empty (IoU 0), the square exact: AP 50 over both;
    # keep_peak: the stroke reaches IoU 0.5 (AP 10 for it).
    assert tables["official"]["< 16 px"] == (2, 50.0)
    assert tables["official, keep_peak"]["< 16 px"] == (2, pytest.approx(55.0))
    out = capsys.readouterr().out
    assert "| official | 50.0 | nan | nan | nan | 50.0 |" in out
    (record,) = [json.loads(line) for line in (tmp_path / "mask_cap.jsonl").read_text().split("\n")
                 if line]
    assert record["benchmark"] == "mask_cap"
    assert record["metrics"]["official, keep_peak"]["all"] == pytest.approx(55.0)
    assert record["run"]["settings"]["official"]["mask_threshold"] == 0.4


def test_the_coco_ap_of_the_perfect_predictor_by_hand(monkeypatch, capsys):
    # official: the square's mask (IoU 1) scores first, the stroke's empty mask (IoU 0) is a
    # false positive after it; recall 0.5 at precision 1 covers 51 of COCO's 101 recall
    # points at every IoU threshold: AP 51 / 101, against the oracle's 50.
    monkeypatch.setattr(bound, "load_images", lambda dataset: one_stroke_image())
    tables = bound.main(["--presets", "official", "--coco"])
    assert tables["official"]["COCO AP"] == (2, pytest.approx(100 * 51 / 101))
    assert "| official | 50.0 | nan | nan | nan | 50.0 | 50.5 |" in capsys.readouterr().out


def test_thin_shapes_are_rendered_with_their_masks_and_tight_boxes(monkeypatch):
    from fcos_d2.data import synthetic_thin

    monkeypatch.setattr(synthetic_thin, "NUM_IMAGES", {"val": 3, "train": 3})
    images = bound.load_images("synthetic_thin_val")
    assert images and all(masks.dtype == torch.bool for masks, _ in images)
    for masks, boxes in images:
        for mask, (x1, y1, x2, y2) in zip(masks, boxes.long().tolist()):
            assert mask[y1:y2, x1:x2].sum() == mask.sum()  # inside the box
            assert mask[y1].any() and mask[y2 - 1].any() and mask[:, x1].any()  # tight


def test_the_tool_counts_the_objects_with_an_empty_threshold_target(monkeypatch, capsys):
    monkeypatch.setattr(bound, "load_images", lambda dataset: one_stroke_image())
    bound.main(["--presets", "official"])
    assert "threshold target is empty: 1 of 2; under 16 px 1 of 2" in capsys.readouterr().out
