"""NAS-FCOS operations and aggregations on small inputs computed by hand."""
import math

import pytest
import torch
from torch import nn

import fcos_d2  # noqa: F401  (detectron2 without its C++ extension)
from fcos_d2.modeling.layers import DeformConv2d, SeparableConv2d
from fcos_d2.modeling.nas_fcos.ops import (ConcatReduce, ParamSum, build_aggregation,
                                           build_fpn_op, build_head_op)

BN_SCALE = 1 / math.sqrt(1 + 1e-5)  # a fresh BatchNorm in eval: (x - 0) / sqrt(1 + eps)


def test_psum_is_a_times_x_plus_b_times_y_per_channel():
    psum = ParamSum(2)
    with torch.no_grad():
        psum.a.copy_(torch.tensor([2.0, 0.5]))
        psum.b.copy_(torch.tensor([1.0, -1.0]))
    x = torch.tensor([1.0, 2.0]).view(1, 2, 1, 1)
    y = torch.tensor([3.0, 4.0]).view(1, 2, 1, 1)
    assert psum(x, y).flatten().tolist() == [5.0, -3.0]  # 2*1 + 3, 0.5*2 - 4


def test_psum_upsamples_the_coarser_input_to_the_finer():
    x = torch.arange(4.0).view(1, 1, 2, 2)
    y = torch.full((1, 1, 1, 1), 3.0)
    out = ParamSum(1)(y, x)  # either order: the result has the finer size
    assert out.shape == (1, 1, 2, 2)
    assert out.flatten().tolist() == [3.0, 4.0, 5.0, 6.0]


def test_cat_mixes_channel_pairs_with_a_grouped_1x1_conv():
    cat = ConcatReduce(2).eval()
    assert cat.conv.groups == 2 and tuple(cat.conv.weight.shape) == (2, 2, 1, 1)
    with torch.no_grad():
        cat.conv.weight.copy_(torch.tensor([[1.0, 10.0], [100.0, 1000.0]]).view(2, 2, 1, 1))
    x = torch.tensor([1.0, 2.0]).view(1, 2, 1, 1)
    y = torch.tensor([3.0, 4.0]).view(1, 2, 1, 1)
    # output 0 = x0 + 10 x1 (x's pair), output 1 = 100 y0 + 1000 y1 (y's pair)
    expected = torch.tensor([21.0, 4300.0]) * BN_SCALE
    torch.testing.assert_close(cat(x, y).flatten(), expected)


def test_cat_applies_relu_after_its_norm():
    cat = ConcatReduce(1).eval()
    with torch.no_grad():
        cat.conv.weight.fill_(1.0)
    out = cat(torch.full((1, 1, 1, 1), -5.0), torch.full((1, 1, 1, 1), 2.0))
    assert out.item() == pytest.approx(2.0 * BN_SCALE)  # the -5 is cut by the ReLU


@pytest.mark.parametrize("name, step", [("sep_conv_3x3", 1), ("sep_conv_3x3_dil3", 3),
                                        ("sep_conv_5x5_dil6", 6)])
def test_separable_ops_reach_the_taps_of_their_dilation(name, step):
    op = build_fpn_op(name, 1).eval()
    assert isinstance(op, SeparableConv2d) and isinstance(op.norm, nn.BatchNorm2d)
    with torch.no_grad():
        op.depthwise.weight.fill_(1.0)
        op.pointwise.weight.fill_(1.0)
    x = torch.zeros(1, 1, 25, 25)
    x[0, 0, 12, 12] = 1.0
    out = op(x)[0, 0]
    assert out.shape == (25, 25)  # size kept
    half = op.depthwise.kernel_size[0] // 2
    expected = {(12 + step * i, 12 + step * j) for i in range(-half, half + 1)
                for j in range(-half, half + 1)}
    assert {tuple(p) for p in out.nonzero().tolist()} == expected
    assert out[12, 12].item() == pytest.approx(BN_SCALE)


def test_skip_connect_is_the_identity():
    x = torch.randn(1, 32, 3, 3)
    for op in (build_fpn_op("skip_connect", 32), build_head_op("skip_connect", 32)):
        assert torch.equal(op(x), x)


def test_def_conv_starts_as_a_half_masked_regular_conv_with_two_deform_groups():
    op = build_fpn_op("def_conv_3x3", 2).eval()
    assert isinstance(op, DeformConv2d) and op.modulated
    assert op.offset.out_channels == 2 * 3 * 9  # 2 groups x (dy, dx, mask) x 9 taps
    with torch.no_grad():
        op.weight.fill_(1.0)
        op.bias.zero_()
    out = op(torch.ones(1, 2, 3, 3))[0, 0]
    # zero offsets, masks sigmoid(0) = 0.5: centre sums 2 channels x 9 taps, a corner 2 x 4
    assert out[1, 1].item() == pytest.approx(0.5 * 18 * BN_SCALE, rel=1e-5)
    assert out[0, 0].item() == pytest.approx(0.5 * 8 * BN_SCALE, rel=1e-5)


def test_fpn_ops_end_with_batchnorm_and_head_ops_with_groupnorm_32():
    for name in ("sep_conv_3x3", "def_conv_3x3"):
        assert isinstance(build_fpn_op(name, 32).norm, nn.BatchNorm2d)
        head_norm = build_head_op(name, 64).norm
        assert isinstance(head_norm, nn.GroupNorm) and head_norm.num_groups == 32
    for name, kernel in (("conv1x1", 1), ("conv3x3", 3)):
        conv, norm, act = build_head_op(name, 64)
        assert conv.kernel_size == (kernel, kernel) and conv.bias is None
        assert norm.num_groups == 32 and isinstance(act, nn.ReLU)


def test_unknown_names_are_refused_with_the_known_ones():
    with pytest.raises(KeyError, match="max_pool.*sep_conv_3x3"):
        build_fpn_op("max_pool", 8)
    with pytest.raises(KeyError, match="sum.*psum"):
        build_aggregation("sum", 8)


def test_def_conv_runs_under_cpu_bf16_autocast_in_float32():
    op = build_fpn_op("def_conv_3x3", 2).eval()
    x = torch.randn(1, 2, 5, 5)
    expected = op(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = op(x)  # torchvision's CPU kernel has no bf16: the layer computes in float32
    torch.testing.assert_close(out.float(), expected, atol=0.1, rtol=0.05)
