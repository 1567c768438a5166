"""NAS-FCOS checkpoints in the authors' layout and mmdetection's: state dicts written in
their names (by hand-written inverse maps of models built like theirs) load exactly, and
a missing key, an extra key or a wrong shape is named."""
import re

import pytest
import torch
from nas_fcos_models import small_nas_fcos

from fcos_d2.checkpoint.layouts import checkpoint_layout, convert_foreign_checkpoint
from fcos_d2.checkpoint.official import CheckpointMismatchError
from fcos_d2.modeling.layers import DeformConv2d, SeparableConv2d
from fcos_d2.modeling.nas_fcos.checkpoint_mmdet import MMDET_CELLS
from fcos_d2.modeling.nas_fcos.ops import ConcatReduce

# Every kind of operation and aggregation, and a head with per-level layers.
FPN = [[1, 2, "sep_conv_3x3", "def_conv_3x3", "psum"],
       [3, 4, "sep_conv_5x5_dil6", "skip_connect", "cat"],
       [2, 3, "sep_conv_3x3_dil3", "skip_connect", "psum"],
       [1, 1, "skip_connect", "skip_connect", "cat"]]
HEAD = ["def_conv_3x3", "sep_conv_3x3", "conv1x1", "conv3x3"]


def _their_op(module, rest: str) -> str:
    """Our name inside one operation -> the NAS-FCOS code's."""
    if isinstance(module, SeparableConv2d):
        return {"depthwise": "op.sep_0.0", "pointwise": "op.sep_0.1", "norm": "op.sep_0.2"}[
            rest.split(".")[0]] + "." + rest.split(".", 1)[1]
    if isinstance(module, DeformConv2d):
        if rest.startswith("offset."):
            return "dcn.0.conv_offset_mask." + rest[len("offset."):]
        return ("dcn.1." + rest[len("norm."):]) if rest.startswith("norm.") else "dcn.0." + rest
    if isinstance(module, ConcatReduce):
        return {"norm": "conv1x1.0", "conv": "conv1x1.2"}[rest.split(".")[0]] + "." + \
            rest.split(".", 1)[1]
    return rest  # psum's a, b; head Sequential(conv, GN, ReLU) 0.*, 1.*


def _their_resnet(rest: str) -> str:
    rest = re.sub(r"^stem\.conv1\.norm\.", "stem.bn1.", rest)
    rest = re.sub(r"^res(\d)", lambda m: f"layer{int(m[1]) - 1}", rest)
    rest = re.sub(r"\.conv(\d)\.norm\.", r".bn\1.", rest)
    return rest.replace(".shortcut.norm.", ".downsample.1.").replace(".shortcut.", ".downsample.0.")


def to_authors_layout(model):
    """Our state dict in the names of the NAS-FCOS code (module. prefix, as DDP saves)."""
    out = {}
    for key, value in model.state_dict().items():
        if key.endswith("num_batches_tracked"):
            continue
        parts = key.split(".")
        if key.startswith("backbone.bottom_up."):
            new = "encoder.body." + _their_resnet(key[len("backbone.bottom_up."):])
            value = value + 1e-5 if key.endswith("running_var") else value
        elif key.startswith("backbone.adapt."):
            new = f"decoder.fpn.adapt{int(parts[2]) + 1}." + ".".join(parts[3:])
        elif key.startswith("backbone.cells."):
            cell, slot = parts[2], parts[3]
            index, rest = ("2", ".".join(parts[4:])) if slot == "aggregate" \
                else (parts[4], ".".join(parts[5:]))
            module = model.get_submodule(".".join(parts[:4] if slot == "aggregate" else parts[:5]))
            new = f"decoder.fpn._ops.{cell}.{index}.{_their_op(module, rest)}"
        elif key.startswith("backbone.top_block."):
            new = "decoder.fpn.top_blocks." + key[len("backbone.top_block."):]
        elif re.match(r"head\.(cls|reg)_(split|shared)\.", key):
            tower, kind = parts[1].split("_")
            path = parts[:3] if kind == "shared" else parts[:4]
            module = model.get_submodule(".".join(path))
            where = f"_{tower}_head_global_ops.{parts[2]}" if kind == "shared" \
                else f"_{tower}_head_split_ops.{parts[2]}.{parts[3]}"
            new = f"decoder.rpn.head.{where}.{_their_op(module, '.'.join(parts[len(path):]))}"
        else:
            new = "decoder.rpn." + key
        out["module." + new] = value.clone()
    return out


@pytest.fixture(scope="module")
def searched():
    torch.manual_seed(0)
    return small_nas_fcos(FPN_GENOTYPE=FPN, HEAD_GENOTYPE=HEAD, HEAD_SHARE_INDEX=2)


def _assert_same(converted, model):
    ours = model.state_dict()
    for key, value in converted.items():
        if not key.endswith("num_batches_tracked"):  # filled from the model
            torch.testing.assert_close(value, ours[key].float(), atol=1e-6, rtol=0, msg=key)


def test_authors_checkpoint_loads_every_tensor_where_it_belongs(searched):
    theirs = to_authors_layout(searched)
    assert "module.decoder.fpn._ops.1.2.conv1x1.2.weight" in theirs  # cat's grouped 1x1
    assert theirs["module.decoder.fpn._ops.1.2.conv1x1.2.weight"].shape == (32, 2, 1, 1)
    assert "module.decoder.rpn.head._cls_head_split_ops.4.1.op.sep_0.1.weight" in theirs
    assert "module.decoder.rpn.head._reg_head_global_ops.0.0.weight" in theirs
    assert checkpoint_layout(theirs) == "nas_fcos"
    result = convert_foreign_checkpoint({"model": theirs}, searched, source="theirs.pth")
    _assert_same(result["model"], searched)
    assert "NAS-FCOS checkpoint (the authors' code)" in result["__converted__"]


def test_an_adapter_of_an_input_no_cell_reads_is_dropped(searched):
    theirs = to_authors_layout(searched)
    theirs["module.decoder.fpn.adapt1.0.weight"] = torch.zeros(32, 64, 1, 1)  # C2's
    result = convert_foreign_checkpoint({"model": theirs}, searched, source="theirs.pth")
    assert "dropped the adapters of backbone inputs ['0']" in result["__converted__"]


@pytest.mark.parametrize("change, message", [
    (lambda sd: sd.pop("module.decoder.rpn.head.cls_logits.bias"),
     r"missing \(1\): head\.cls_logits\.bias"),
    (lambda sd: sd.update({"module.decoder.fpn.mystery.weight": torch.zeros(1)}),
     r"1 keys of the NAS-FCOS checkpoint have no fcos-d2 name: module\.decoder\.fpn\.mystery"),
    (lambda sd: sd.update({"module.decoder.fpn._ops.0.2.a": torch.ones(16)}),
     r"backbone\.cells\.0\.aggregate\.a \(16,\) \(model: \(32,\)\)"),
])
def test_authors_checkpoint_errors_name_the_keys(searched, change, message):
    theirs = to_authors_layout(searched)
    change(theirs)
    with pytest.raises(CheckpointMismatchError, match=r"MODEL.WEIGHTS theirs.pth: (.|\n)*"
                       + message):
        convert_foreign_checkpoint({"model": theirs}, searched, source="theirs.pth")


def to_mmdet_layout(model):
    """Our published-genotype state dict in mmdetection's NAS-FCOS names."""
    out = {}
    for key, value in model.state_dict().items():
        if key.endswith("num_batches_tracked"):
            continue
        parts = key.split(".")
        if key.startswith("backbone.bottom_up."):
            new = "backbone." + _their_resnet(key[len("backbone.bottom_up."):])
            new = new.replace("backbone.stem.conv1.", "backbone.conv1.").replace(
                "backbone.stem.bn1.", "backbone.bn1.")
            value = value + 1e-5 if key.endswith("running_var") else value
        elif key.startswith("backbone.adapt."):
            new = f"neck.adapt_convs.{int(parts[2]) - 1}." + \
                {"0": "conv", "1": "bn"}[parts[3]] + "." + parts[4]
        elif key.startswith("backbone.cells."):
            name = f"neck.fpn.{MMDET_CELLS[int(parts[2])]}"
            if parts[3] == "aggregate":
                new = f"{name}.out_conv.{'conv' if parts[4] == 'conv' else 'bn'}.{parts[5]}"
            else:
                rest = ".".join(parts[5:])
                rest = re.sub(r"^offset\.", "conv.conv_offset.", rest)
                rest = re.sub(r"^norm\.", "bn.", rest)
                rest = re.sub(r"^(weight|bias)$", r"conv.\1", rest)
                new = f"{name}.op{int(parts[4]) + 1}.{rest}"
        elif key.startswith("backbone.top_block."):
            new = f"neck.extra_downsamples.{int(parts[2][1]) - 6}.conv.{parts[3]}"
        elif re.match(r"head\.(cls|reg)_shared\.", key):
            rest = ".".join(parts[3:])
            for ours, theirs in ((r"^offset\.", "conv.conv_offset."), (r"^norm\.", "gn."),
                                 (r"^(weight|bias)$", r"conv.\1"), (r"^0\.", "conv."),
                                 (r"^1\.", "gn.")):
                rest = re.sub(ours, theirs, rest)
            new = f"bbox_head.{parts[1][:3]}_convs.{parts[2]}.{rest}"
        else:
            new = "bbox_head." + {"cls_logits": "conv_cls", "bbox_pred": "conv_reg",
                                  "centerness": "conv_centerness"}.get(parts[1], parts[1]) \
                + "." + ".".join(parts[2:])
        out[new] = value.clone()
    return out


def test_mmdet_checkpoint_of_the_published_genotype_loads_exactly():
    torch.manual_seed(1)
    model = small_nas_fcos()  # published FPN and head
    theirs = to_mmdet_layout(model)
    assert "neck.fpn.c61.op2.conv.conv_offset.weight" in theirs
    assert "bbox_head.cls_convs.3.conv.weight" in theirs  # the conv1x1, 4th layer
    assert checkpoint_layout(theirs) == "mmdet_nas_fcos"
    result = convert_foreign_checkpoint({"model": theirs}, model, source="mmdet.pth")
    _assert_same(result["model"], model)
    theirs.pop("neck.fpn.c02.out_conv.bn.running_mean")
    with pytest.raises(CheckpointMismatchError,
                       match=r"missing \(1\): backbone\.cells\.3\.aggregate\.norm\.running_mean"):
        convert_foreign_checkpoint({"model": theirs}, model, source="mmdet.pth")


def test_the_seven_published_models_are_in_the_zoo_with_their_mega_links():
    from fcos_d2 import model_zoo
    names = ["Mobile_NAS", "Mobile_NAS_head", "R_50_NAS", "R_50_NAS_head", "R_101_NAS",
             "R_101_NAS_head", "R_101_X_32x8d_NAS"]
    for name in names:
        zoo_name = model_zoo.resolve_name(f"fcos-d2://NAS-FCOS/{name}")
        assert model_zoo.get_checkpoint_url(zoo_name).startswith("https://mega.nz/#!")
        assert model_zoo.get_config_file(zoo_name).endswith(f"configs/NAS-FCOS/{name}.yaml")


def _their_mobilenet(rest: str) -> str:
    """torchvision's MobileNetV2 names -> the NAS-FCOS code's flat Sequential indices."""
    block, rest = rest.split(".", 1)
    if block == "0":
        return f"features.0.{rest}"
    table = {"1": {"0.0": "0", "0.1": "1", "1": "3", "2": "4"}}.get(
        block, {"0.0": "0", "0.1": "1", "1.0": "3", "1.1": "4", "2": "6", "3": "7"})
    match = re.fullmatch(r"conv\.(\d(?:\.\d)?)\.(\w+)", rest)
    return f"features.{block}.conv.{table[match[1]]}.{match[2]}"


def test_authors_mobilenet_checkpoint_loads_exactly():
    torch.manual_seed(2)
    model = small_nas_fcos(BOTTOM_UP="mobilenet_v2", HEAD_GENOTYPE=[])  # Mobile_NAS
    theirs = {}
    for key, value in to_authors_layout(model).items():
        if key.startswith("module.encoder.body."):
            rest = key[len("module.encoder.body.features."):]
            value = value - 1e-5 if key.endswith("running_var") else value  # trainable BN
            key = "module.encoder.body." + _their_mobilenet(rest)
        theirs[key] = value
    assert "module.encoder.body.features.1.conv.3.weight" in theirs  # t=1: dw, bn, pw, bn
    assert "module.encoder.body.features.17.conv.7.running_var" in theirs
    assert "module.decoder.rpn.head.cls_tower.0.weight" in theirs  # FCOS's head
    result = convert_foreign_checkpoint({"model": theirs}, model, source="mbv2.pth")
    _assert_same(result["model"], model)


def test_the_seven_published_configs_build():
    from detectron2.config import get_cfg
    from detectron2.modeling import build_model

    import fcos_d2
    heads = {}
    for name in ("Mobile_NAS", "Mobile_NAS_head", "R_50_NAS", "R_50_NAS_head", "R_101_NAS",
                 "R_101_NAS_head", "R_101_X_32x8d_NAS"):
        cfg = get_cfg()
        fcos_d2.add_fcos_config(cfg)
        cfg.merge_from_file(fcos_d2.get_config_file(f"NAS-FCOS/{name}.yaml"))
        cfg.MODEL.DEVICE = "cpu"
        model = build_model(cfg)
        heads[name] = type(model.head).__name__
        assert model.backbone.output_shape()["p7"].stride == 128
    assert heads == {name: "NASFCOSHead" if name.endswith("_head") else "FCOSHead"
                     for name in heads}
