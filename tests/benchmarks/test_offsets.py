"""benchmarks.train_quality.offsets: the DCN diagnosis on hand-set offsets."""
import pytest
import torch
from torch import nn

from benchmarks.train_quality.offsets import collect, offset_statistics, table
from fcos_d2.modeling.layers import DeformConv2d


def conv_with_offset(dy: float, dx: float, modulated: bool = True) -> DeformConv2d:
    """A 3x3 DCN (1 group) whose every tap moves by (dy, dx); masks sigmoid(0) = 0.5."""
    conv = DeformConv2d(4, 4, modulated=modulated)
    with torch.no_grad():
        conv.offset.bias[0:18:2] = dy
        conv.offset.bias[1:18:2] = dx
    return conv


def test_zero_offsets_sample_only_the_padding_ring():
    stats = offset_statistics(conv_with_offset(0.0, 0.0), torch.randn(2, 4, 4, 4))
    assert (stats["height"], stats["width"]) == (4, 4)
    assert stats["mean_abs_offset"] == stats["max_abs_offset"] == 0.0
    assert stats["mask"] == pytest.approx(0.5)
    # on a 4x4 map the 3x3 taps at padding 1 read rows r - 1 + t: 2 of the 12 (row, tap)
    # pairs fall on row -1 or 4, as for columns; inside both: (10 / 12) ** 2
    assert stats["outside"] == pytest.approx(1 - (10 / 12) ** 2)


def test_offsets_a_map_long_sample_outside_it():
    stats = offset_statistics(conv_with_offset(4.0, -1.5), torch.randn(1, 4, 4, 4))
    assert stats["mean_abs_offset"] == pytest.approx(2.75)
    assert stats["max_abs_offset"] == pytest.approx(4.0)
    # rows r + t + 3 are inside only for r = t = 0 (1 of 12 pairs); columns c + t - 2.5
    # are outside for c + t <= 1 (3 of 12)
    assert stats["outside"] == pytest.approx(1 - (1 / 12) * (9 / 12))


def test_dcn_v1_has_no_mask():
    stats = offset_statistics(conv_with_offset(0.5, 0.5, modulated=False),
                              torch.randn(1, 4, 8, 8))
    assert stats["mask"] == 1.0
    assert 0.0 < stats["outside"] < 1.0


def test_collect_hooks_every_deformable_conv_and_removes_its_hooks():
    model = nn.Sequential(conv_with_offset(0.0, 0.0), nn.ReLU(), conv_with_offset(1.0, 1.0))
    stats = collect(model, [torch.randn(1, 4, 6, 6), torch.randn(1, 4, 6, 6)])
    assert sorted(stats) == ["0 @ 6x6", "2 @ 6x6"]
    assert [len(rows) for rows in stats.values()] == [2, 2]
    assert all(not m._forward_hooks for m in model)
    text = table(stats)
    assert "| `2 @ 6x6` | 6x6 | 1.00 | 1.0 |" in text
    shared = collect(model[:1], [torch.randn(1, 4, 6, 6), torch.randn(1, 4, 3, 3)])
    assert sorted(shared) == ["0 @ 3x3", "0 @ 6x6"]  # one conv on two levels: two rows


def test_the_record_holds_every_conv_averaged_over_batches():
    from argparse import Namespace

    from benchmarks.train_quality.offsets import offsets_record

    model = nn.Sequential(conv_with_offset(2.0, 0.0))
    stats = collect(model, [torch.randn(1, 4, 4, 4), torch.randn(1, 4, 4, 4)])
    args = Namespace(opts=["MODEL.X", "1"], contender="c", weights="w.pth", batches=2)
    record = offsets_record(stats, args, "python -m benchmarks.train_quality.offsets")
    assert record["benchmark"] == "dcn_offsets" and record["overrides"] == ["MODEL.X", "1"]
    conv = record["metrics"]["convs"]["0 @ 4x4"]
    assert conv["map"] == [4, 4]
    assert conv["mean_abs_offset"] == pytest.approx(1.0)  # dy 2, dx 0
    assert conv["max_abs_offset"] == pytest.approx(2.0)
    assert record["run"] == {"contender": "c", "weights": "w.pth", "batches": 2}
