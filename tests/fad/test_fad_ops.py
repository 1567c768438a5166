"""FAD's candidate operations, RepShare and the mixed operation."""
import math

import pytest
import torch
from torch import nn

from fcos_d2.modeling.fad.genotypes import NONE, PRIMITIVES
from fcos_d2.modeling.fad.ops import MixedOp, RepShare, StackedOp, build_op, op_spec

C = 32  # the fewest channels GN's 32 groups allow
OPS = [name for name in PRIMITIVES if name != NONE]


def _identity_kernels(module: nn.Module) -> None:
    """Every conv an identity: the center tap 1 on its own channel (depthwise: on itself),
    biases 0; GN stays affine-identity."""
    for conv in module.modules():
        if isinstance(conv, nn.Conv2d):
            nn.init.zeros_(conv.weight)
            k = conv.kernel_size[0] // 2
            for c in range(conv.out_channels):
                conv.weight.data[c, 0 if conv.groups > 1 else c, k, k] = 1.0
            if conv.bias is not None:
                nn.init.zeros_(conv.bias)


@pytest.mark.parametrize("name", PRIMITIVES)
def test_every_op_keeps_the_shape(name):
    x = torch.randn(2, C, 7, 9)
    assert build_op(name, C)(x).shape == (2, C, 7, 9)


def test_op_names_decode_to_family_depth_and_dilation():
    assert op_spec("std_conv_3x3") == ("std", 1, False)
    assert op_spec("sinSep_conv_3x3_x2+dil_conv_3x3") == ("sinSep", 2, True)
    assert op_spec("std_conv_3x3_x3") == ("std", 3, False)
    with pytest.raises(ValueError, match="unknown FAD operation 'sep_conv_3x3'"):
        op_spec("sep_conv_3x3")


@pytest.mark.parametrize("name", OPS)
def test_op_with_identity_kernels_is_relu_of_group_norm(name):
    # Each channel holds [[0, 0], [0, 4]]: mean 1, variance 3, so GN gives
    # [-1, -1, -1, 3] / sqrt(3) and ReLU [0, 0, 0, sqrt(3)]; a second layer maps
    # [0, 0, 0, sqrt(3)] to the same values again (a fixed point of GN + ReLU).
    op = build_op(name, C)
    _identity_kernels(op)
    x = torch.zeros(1, C, 2, 2)
    x[..., 1, 1] = 4.0
    expected = torch.zeros(1, C, 2, 2)
    expected[..., 1, 1] = math.sqrt(3.0)
    torch.testing.assert_close(op(x), expected, atol=1e-4, rtol=0)


def test_none_is_zero():
    assert torch.equal(build_op(NONE, C)(torch.randn(1, C, 3, 3)), torch.zeros(1, C, 3, 3))


def _separate_ops_holding(repshare: RepShare):
    """The family's five StackedOps, sharing RepShare's layers."""
    ops = []
    for name in OPS:
        spec = op_spec(name)
        if spec.family != repshare.family:
            continue
        op = StackedOp(spec, C)
        op.layers = nn.Sequential(*repshare.stack[:spec.depth])
        if spec.dilated:
            op.dilated = repshare.dilated[spec.depth - 1]
        ops.append(op)
    return ops


@pytest.mark.parametrize("family", ["std", "sinSep"])
def test_repshare_returns_exactly_the_five_separate_ops(family):
    torch.manual_seed(0)
    repshare = RepShare(family, C, decouple=False)
    x = torch.randn(2, C, 5, 6)
    shared = repshare(x)
    separate = [op(x) for op in _separate_ops_holding(repshare)]
    assert len(shared) == 5
    for a, b in zip(shared, separate):
        assert torch.equal(a, b)


def test_repshare_decouples_only_the_shared_stack_outputs():
    torch.manual_seed(0)
    repshare = RepShare("std", C, decouple=True)
    x = torch.randn(1, C, 4, 4)
    outputs = repshare(x)
    x1 = repshare.stack[0](x)
    x2 = repshare.stack[1](x1)
    assert torch.equal(outputs[0], repshare.decouple[0](x1))
    assert torch.equal(outputs[1], repshare.dilated[0](x1))  # the branch reads x1 itself
    assert torch.equal(outputs[2], repshare.decouple[1](x2))
    assert torch.equal(outputs[3], repshare.dilated[1](x2))
    assert torch.equal(outputs[4], repshare.stack[2](x2))  # the last has no decouple conv


@pytest.mark.parametrize("repshare", [True, False])
@pytest.mark.parametrize("index", [0, 3, 6, 9, 10])
def test_mixed_op_with_one_hot_weights_equals_that_op(repshare, index):
    torch.manual_seed(0)
    mixed = MixedOp(C, repshare=repshare)
    x = torch.randn(1, C, 4, 5)
    weights = torch.zeros(len(PRIMITIVES))
    weights[index] = 1.0
    expected = (torch.zeros_like(x) if PRIMITIVES[index] == NONE
                else mixed.candidate_outputs(x)[index])
    if not repshare and PRIMITIVES[index] != NONE:
        assert torch.equal(expected, mixed.candidates[index](x))
    torch.testing.assert_close(mixed(x, weights), expected, atol=0, rtol=0)
