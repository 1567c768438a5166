"""NAS-FCOS genotypes (validity rule, parsing) and the FPN and head they build."""
from typing import Dict

import pytest
import torch
from detectron2.layers import ShapeSpec
from detectron2.modeling import Backbone
from torch import nn

import fcos_d2  # noqa: F401
from fcos_d2.modeling.layers import DeformConv2d
from fcos_d2.modeling.nas_fcos import NASFCOSFPN, NASFCOSHead
from fcos_d2.modeling.nas_fcos.genotypes import (PUBLISHED_FPN, PUBLISHED_HEAD,
                                                 FPNGenotype, GenotypeError, HeadGenotype,
                                                 parse_fpn_genotype, parse_head_genotype)
from fcos_d2.modeling.nas_fcos.ops import ConcatReduce, ParamSum

# C2-C5 of a 64 x 64 image: constant maps 1, 2, 4, 8, so that bilinear resizing is exact.
SIZES = {"res2": 16, "res3": 8, "res4": 4, "res5": 2}
VALUES = {"res2": 1.0, "res3": 2.0, "res4": 4.0, "res5": 8.0}


class ConstantBottomUp(Backbone):
    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels

    def forward(self, x):
        return {k: torch.full((x.shape[0], self.channels, s, s), VALUES[k])
                for k, s in SIZES.items()}

    def output_shape(self) -> Dict[str, ShapeSpec]:
        return {k: ShapeSpec(channels=self.channels, stride=64 // s) for k, s in SIZES.items()}


def _fpn(genotype: FPNGenotype, channels: int = 32, identity_adapters: bool = True):
    fpn = NASFCOSFPN(bottom_up=ConstantBottomUp(channels), in_features=list(SIZES),
                     genotype=genotype, channels=channels, top_blocks=False).eval()
    if identity_adapters:
        fpn.adapt = nn.ModuleDict({key: nn.Identity() for key in fpn.adapt})
    return fpn


def test_published_genotype_outputs_p5_f8_p4_f9_p3_f10_each_plus_f6():
    assert PUBLISHED_FPN.unused() == [6, 8, 9, 10]
    assert PUBLISHED_FPN.describe() == "P5 = f8 + f6, P4 = f9 + f6, P3 = f10 + f6"
    assert PUBLISHED_HEAD.ops == ("def_conv_3x3", "conv3x3", "def_conv_3x3", "conv1x1",
                                  "skip_connect", "skip_connect")
    assert PUBLISHED_HEAD.share_index == 0


def test_a_hand_written_genotype_builds_the_graph_it_describes():
    # f4 = C5 + C4, f5 = C3 + C2, f6 = C5 + C5, f7 = C4 + C4; unused: f4..f7, so f4 is
    # added to P5 = f5, P4 = f6 and P3 = f7, which are resized to C5, C4 and C3.
    genotype = parse_fpn_genotype([[3, 2, "skip_connect", "skip_connect", "psum"],
                                   [1, 0, "skip_connect", "skip_connect", "psum"],
                                   [3, 3, "skip_connect", "skip_connect", "psum"],
                                   [2, 2, "skip_connect", "skip_connect", "psum"]])
    out = _fpn(genotype)(torch.zeros(1, 3, 64, 64))
    expected = {"p3": (8, 20.0), "p4": (4, 28.0), "p5": (2, 15.0)}  # f7+f4, f6+f4, f5+f4
    assert sorted(out) == ["p3", "p4", "p5"]
    for name, (size, value) in expected.items():
        assert out[name].shape == (1, 32, size, size)
        torch.testing.assert_close(out[name], torch.full_like(out[name], value))


def test_native_strides_follow_each_output_cell_to_its_finest_input():
    # as above: P3 = f7 (C4 + C4: 16), P4 = f6 (C5 + C5: 32), P5 = f5 (C3 + C2: 4)
    genotype = parse_fpn_genotype([[3, 2, "skip_connect", "skip_connect", "psum"],
                                   [1, 0, "skip_connect", "skip_connect", "psum"],
                                   [3, 3, "skip_connect", "skip_connect", "psum"],
                                   [2, 2, "skip_connect", "skip_connect", "psum"]])
    assert genotype.native_strides() == [16, 32, 4]
    assert genotype.native_strides((2, 4, 8, 16)) == [8, 16, 2]
    # the published FPN computes P3 and P4 at stride 8 (f10 = f7 + C4, f9 = f4 + f7, f7 reads C3)
    assert PUBLISHED_FPN.native_strides() == [8, 8, 32]


def test_published_fpn_has_its_cells_deformable_ops_and_grouped_cat():
    fpn = _fpn(PUBLISHED_FPN, identity_adapters=False)
    assert [cell.inputs for cell in fpn.cells] == [(3, 3), (3, 3), (4, 3), (1, 3), (5, 3),
                                                   (4, 7), (7, 2)]
    assert sum(isinstance(m, DeformConv2d) for m in fpn.modules()) == 12
    assert sorted(fpn.adapt) == ["1", "2", "3"]  # no cell reads C2: it has no adapter
    assert all(isinstance(cell.aggregate, ConcatReduce) for cell in fpn.cells)
    assert all(cell.aggregate.conv.groups == 32 for cell in fpn.cells)
    out = fpn(torch.zeros(2, 3, 64, 64))
    assert [tuple(out[k].shape) for k in ("p3", "p4", "p5")] == \
        [(2, 32, 8, 8), (2, 32, 4, 4), (2, 32, 2, 2)]


def test_psum_cells_hold_their_two_weights():
    genotype = parse_fpn_genotype([[0, 1, "sep_conv_3x3", "skip_connect", "psum"]] * 3)
    assert all(isinstance(c.aggregate, ParamSum) for c in _fpn(genotype).cells)


def test_fewer_than_three_unused_outputs_are_refused():
    chain = [[3, 2, "skip_connect", "skip_connect", "psum"],
             [4, 1, "skip_connect", "skip_connect", "psum"],
             [5, 0, "skip_connect", "skip_connect", "psum"]]  # each reads the previous one
    with pytest.raises(GenotypeError, match=r"only 1 cell outputs \(\[6\]\).*at least 3"):
        parse_fpn_genotype(chain)


@pytest.mark.parametrize("cell, message", [
    ([0, 5, "skip_connect", "skip_connect", "psum"], "input 5 is not in the pool 0..3"),
    ([0, 1, "max_pool", "skip_connect", "psum"], "unknown operation 'max_pool'"),
    ([0, 1, "skip_connect", "skip_connect", "sum"], "unknown aggregation 'sum'"),
    ([0, 1, "skip_connect", "psum"], r"expected \[input index"),
])
def test_invalid_cells_are_named_in_the_error(cell, message):
    good = [[0, 1, "skip_connect", "skip_connect", "psum"]] * 2
    with pytest.raises(GenotypeError, match=r"MODEL.NAS_FCOS.FPN_GENOTYPE: cell 0.*" + message):
        parse_fpn_genotype([cell] + good)


def test_genotypes_round_trip_through_their_config_values():
    assert parse_fpn_genotype(PUBLISHED_FPN.to_config()) == PUBLISHED_FPN
    assert parse_head_genotype(*PUBLISHED_HEAD.to_config()) == PUBLISHED_HEAD
    with pytest.raises(GenotypeError, match="HEAD_SHARE_INDEX: 7 is not in 0..6"):
        parse_head_genotype(list(PUBLISHED_HEAD.ops), 7)


def _head(ops, share_index, levels=3, channels=32):
    return NASFCOSHead(input_shape=[ShapeSpec(channels=channels)] * levels, num_classes=2,
                       genotype=HeadGenotype(tuple(ops), share_index))


def test_layers_below_the_share_index_have_weights_per_level():
    head = _head(["conv3x3", "conv1x1", "conv3x3"], share_index=2)
    assert len(head.cls_split) == len(head.reg_split) == 3
    assert all(len(tower) == 2 for tower in head.cls_split)
    assert len(head.cls_shared) == len(head.reg_shared) == 1
    weights = {id(head.cls_split[level][0][0].weight) for level in range(3)}
    assert len(weights) == 3  # three levels, three tensors
    features = [torch.randn(1, 32, 4, 4) for _ in range(3)]
    logits, _, _ = head(features)
    logits[0].sum().backward()  # level 0 only
    assert head.cls_split[0][0][0].weight.grad.abs().sum() > 0
    assert head.cls_split[1][0][0].weight.grad is None
    assert head.cls_shared[0][0].weight.grad.abs().sum() > 0
    assert head.reg_split[0][0][0].weight.grad is None  # the regression tower is separate


def test_share_index_zero_shares_every_layer_and_centerness_reads_the_cls_tower():
    head = _head(["conv1x1"], share_index=0)
    assert all(len(tower) == 0 for tower in head.cls_split) and len(head.cls_shared) == 1
    _, regression, centerness = head([torch.randn(1, 32, 4, 4)] * 3)
    centerness[0].sum().backward()
    assert head.cls_shared[0][0].weight.grad is not None
    assert head.reg_shared[0][0].weight.grad is None
    assert all((r > 0).all() for r in regression)  # exp(scale * x)


def test_centerness_on_reg_changes_only_where_centerness_is_predicted():
    ops = HeadGenotype(("conv3x3", "conv1x1"), 0)
    shapes = [ShapeSpec(channels=32)] * 2
    torch.manual_seed(0)
    on_cls = NASFCOSHead(input_shape=shapes, num_classes=2, genotype=ops)
    on_reg = NASFCOSHead(input_shape=shapes, num_classes=2, genotype=ops,
                         centerness_on_reg=True)
    assert on_reg.state_dict().keys() == on_cls.state_dict().keys()  # the same parameters
    on_reg.load_state_dict(on_cls.state_dict())
    nn.init.normal_(on_cls.centerness.weight)  # a predictor that tells the towers apart
    on_reg.centerness.weight.data.copy_(on_cls.centerness.weight)
    features = [torch.randn(1, 32, 4, 4), torch.randn(1, 32, 2, 2)]
    (logits_c, reg_c, ctr_c), (logits_r, reg_r, ctr_r) = on_cls(features), on_reg(features)
    for a, b in zip(logits_c + reg_c, logits_r + reg_r):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same logits and boxes
    for level, feature in enumerate(features):
        reg_tower = on_cls._run(on_cls.reg_shared, feature)
        cls_tower = on_cls._run(on_cls.cls_shared, feature)
        torch.testing.assert_close(ctr_r[level], on_cls.centerness(reg_tower))
        torch.testing.assert_close(ctr_c[level], on_cls.centerness(cls_tower))
        assert not torch.allclose(ctr_r[level], ctr_c[level])


def test_the_centerness_key_reaches_the_head():
    from detectron2.config import get_cfg

    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(fcos_d2.get_config_file("NAS-FCOS/quickstart.yaml"))
    assert cfg.MODEL.NAS_FCOS.CENTERNESS_ON_REG is False  # the authors' placement
    cfg.MODEL.NAS_FCOS.CENTERNESS_ON_REG = True
    assert NASFCOSHead(cfg, [ShapeSpec(channels=64)] * 3).centerness_on_reg is True
