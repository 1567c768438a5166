"""LabelEnc's pieces: the label map, the LEF's shapes, the losses switched by the
iteration, the frozen LEF of step 2, the plain FCOS left after training, the official
step-1 file's conversion, and MODEL.LABELENC's validation."""
import re
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.solver import build_optimizer
from detectron2.structures import Boxes, Instances
from detectron2.utils.events import EventStorage

from fcos_d2 import add_fcos_config
from fcos_d2.checkpoint import CheckpointMismatchError
from fcos_d2.engine.trainer import Trainer
from fcos_d2.modeling.labelenc import (LabelEncStep1, LabelEncStep2, convert_official_labelenc,
                                       extend_step1_schedule, fcos_state_dict,
                                       init_step2_from_step1)
from fcos_d2.modeling.labelenc.encoder import LabelEncodingFunction, build_label_encoder
from fcos_d2.modeling.labelenc.label_map import label_map, random_label_scales
from fcos_d2.modeling.labelenc.weights import convert_official_lef_key

REPO = Path(__file__).resolve().parents[2]
# the registered META_ARCH of each step, and the step key that must agree with it
STEP1 = ["MODEL.META_ARCHITECTURE", "LabelEncStep1", "MODEL.LABELENC.STEP", 1]
STEP2 = ["MODEL.META_ARCHITECTURE", "LabelEncStep2", "MODEL.LABELENC.STEP", 2]


def tiny_cfg(*opts):
    """ResNet-18 FCOS on P3-P7, FPN width 32, one tower conv, 3 classes; LEF width 16
    (res3-res5 as ResNet-18's)."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    # the recipe as LabelEnc was measured on it (P3-P7)
    cfg.merge_from_file(str(REPO / "configs" / "FCOS-R18-small-data-P3-P7.yaml"))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.FPN.OUT_CHANNELS", 32,
                         "MODEL.FCOS.NUM_CONVS", 1, "MODEL.FCOS.NUM_CLASSES", 3,
                         "MODEL.LABELENC.LEF_WIDTH", 16, *opts])
    return cfg


def batch():
    """Two 64 x 64 images (two: the head's GroupNorm needs more than one value at P7)."""
    torch.manual_seed(0)
    boxes = [[[4.0, 6.0, 40.0, 50.0], [30.0, 10.0, 60.0, 30.0]], [[10.0, 10.0, 50.0, 40.0]]]
    classes = [[0, 2], [1]]
    return [{"image": torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8),
             "instances": Instances((64, 64), gt_boxes=Boxes(torch.tensor(b)),
                                    gt_classes=torch.tensor(c))}
            for b, c in zip(boxes, classes)]


# ------------------------------------------------------------------ label map

def test_label_map_is_one_minus_the_normalized_distance_cut_below_half():
    # a 4 x 4 box centered on (2, 2): 1 at the center, 0.75 one pixel diagonally away,
    # 0.5 on the border (kept), 0.25 one pixel outside (cut)
    out = label_map(torch.tensor([[0.0, 0.0, 4.0, 4.0]]), torch.tensor([1]), num_classes=2,
                    height=6, width=6)
    assert out.shape == (2, 6, 6)
    assert out[1, 2, 2] == 1.0 and out[1, 1, 1] == 0.75 and out[1, 2, 3] == 0.75
    assert out[1, 2, 0] == 0.5 and out[1, 4, 2] == 0.5 and out[1, 4, 4] == 0.5
    assert out[1, 2, 5] == 0 and out[1, 5, 5] == 0
    assert out[0].abs().sum() == 0  # the other class's channel stays empty


def test_overlapping_boxes_of_a_class_take_the_maximum_and_classes_keep_their_channels():
    boxes = torch.tensor([[0.0, 0.0, 4.0, 4.0], [2.0, 2.0, 6.0, 6.0], [0.0, 4.0, 2.0, 6.0]])
    out = label_map(boxes, torch.tensor([0, 0, 1]), num_classes=2, height=6, width=6)
    assert out[0, 3, 3] == 0.75  # 0.75 from both boxes
    assert out[0, 4, 4] == 1.0  # the second box's center; the first gives 0.5 there
    assert out[0, 2, 2] == 1.0  # the first box's center; the second gives 0.5 there
    assert out[1, 5, 1] == 1.0 and out[1, 5, 0] == 0.5
    assert out[1, 1, 1] == 0  # the class-0 boxes are not in channel 1


def test_scaled_boxes_are_cut_first_then_scaled_and_empty_boxes_draw_nothing():
    boxes = torch.tensor([[0.0, 0.0, 4.0, 4.0], [5.0, 5.0, 5.0, 6.0]])
    out = label_map(boxes, torch.tensor([0, 0]), num_classes=1, height=6, width=6,
                    scales=torch.tensor([0.6, 1.0]))
    assert torch.isclose(out[0, 2, 2], torch.tensor(0.6))
    assert torch.isclose(out[0, 2, 0], torch.tensor(0.3))  # 0.5 kept, then scaled
    assert out[0, 5, 5] == 0


def test_step1_scales_are_uniform_on_0_to_2_clipped_at_1():
    torch.manual_seed(0)
    scales = random_label_scales(4000)
    assert scales.min() >= 0 and scales.max() == 1
    assert 0.45 < (scales == 1).float().mean() < 0.55  # P(u >= 1) = 1/2
    assert 0.45 < scales[scales < 1].mean() < 0.55  # uniform on [0, 1) below the clip


# ------------------------------------------------------------------ LEF

def test_lef_encoder_stages_have_the_official_strides_and_widths():
    lef = LabelEncodingFunction(in_channels=3, width=4, depth=(1, 2, 2, 1))
    features = lef(torch.zeros(2, 3, 64, 96))
    assert {k: tuple(v.shape) for k, v in features.items()} == {
        "res2": (2, 16, 16, 24), "res3": (2, 32, 8, 12), "res4": (2, 64, 4, 6),
        "res5": (2, 128, 2, 3)}
    assert len(lef.res3) == 2 and len(lef.res5) == 1


def test_lef_gives_the_detector_levels_names_and_width():
    cfg = tiny_cfg()
    detector = build_model(cfg)
    encoder = build_label_encoder(cfg)
    image = torch.zeros(1, 3, 64, 96)
    expected = {k: tuple(v.shape) for k, v in detector.backbone(image).items()}
    got = {k: tuple(v.shape) for k, v in encoder(torch.zeros(1, 3, 64, 96)).items()}
    assert got == expected == {"p3": (1, 32, 8, 12), "p4": (1, 32, 4, 6), "p5": (1, 32, 2, 3),
                               "p6": (1, 32, 1, 2), "p7": (1, 32, 1, 1)}
    fpn = lambda model: {k: v.shape for k, v in model.state_dict().items()  # noqa: E731
                         if not k.startswith("bottom_up.")}
    assert fpn(encoder) == fpn(detector.backbone)  # step 2 copies one into the other


# ------------------------------------------------------------------ step 1

def test_step1_distance_loss_waits_for_the_warmup_and_never_trains_the_lef():
    torch.manual_seed(0)
    model = build_model(tiny_cfg(*STEP1,
                                          "MODEL.LABELENC.DISTANCE_LOSS_WARMUP_ITERS", 1))
    assert isinstance(model, LabelEncStep1)
    with EventStorage(0):
        before = model(batch())
    with EventStorage(1):
        after = model(batch())
    assert set(after) == {"loss_fcos_cls", "loss_fcos_loc", "loss_fcos_ctr", "loss_labelenc_cls",
                          "loss_labelenc_loc", "loss_labelenc_ctr", "loss_labelenc_distance"}
    assert before["loss_labelenc_distance"] == 0 and after["loss_labelenc_distance"] > 0
    after["loss_labelenc_distance"].backward()
    lef_grads = [p.grad for p in model.label_encoder.parameters()]
    assert all(g is None or g.abs().sum() == 0 for g in lef_grads)  # the targets are detached
    assert model.adapter[0].weight.grad.abs().sum() > 0
    assert model.backbone.bottom_up.stem.conv1.weight.grad.abs().sum() > 0


def test_step1_lef_learns_from_the_head_losses_on_its_features():
    model = build_model(tiny_cfg(*STEP1))
    with EventStorage(0):
        losses = model(batch())
    losses["loss_labelenc_cls"].backward()
    assert model.label_encoder.bottom_up.stem.weight.grad.abs().sum() > 0


def lef_only_step1(*opts):
    torch.manual_seed(0)
    return build_model(tiny_cfg(*STEP1, "MODEL.LABELENC.STEP1_DETECTOR",
                                         False, "MODEL.LABELENC.DISTANCE_LOSS_WARMUP_ITERS", 0,
                                         *opts))


def test_lef_only_step1_trains_the_lef_and_head_and_never_runs_the_frozen_detector():
    model = lef_only_step1()
    calls = _runs(model.backbone, model.adapter)
    with EventStorage(0):
        losses = model(batch())
    assert set(losses) == {"loss_labelenc_cls", "loss_labelenc_loc", "loss_labelenc_ctr"}
    sum(losses.values()).backward()
    assert calls == []
    assert model.label_encoder.bottom_up.stem.weight.grad.abs().sum() > 0
    assert model.head.cls_logits.weight.grad.abs().sum() > 0
    frozen = [*model.backbone.parameters(), *model.adapter.parameters()]
    assert all(not p.requires_grad and p.grad is None for p in frozen)


def test_lef_only_step1_optimizer_holds_the_lef_and_head_alone():
    cfg = tiny_cfg(*STEP1, "MODEL.LABELENC.STEP1_DETECTOR", False,
                   "MODEL.LABELENC.DISTANCE_LOSS_WARMUP_ITERS", 0)
    model = build_model(cfg)
    held = {id(p) for group in build_optimizer(cfg, model).param_groups for p in group["params"]}
    expected = {id(p) for p in [*model.label_encoder.parameters(), *model.head.parameters()]}
    assert held == expected


def test_step2_starts_from_a_lef_only_step1_file(tmp_path):
    path = tmp_path / "step1.pth"
    step1 = lef_only_step1()
    torch.save({"model": step1.state_dict()}, path)
    torch.manual_seed(1)
    step2 = build_model(tiny_cfg(*STEP2))
    init_step2_from_step1(step2, str(path))
    head = step1.head.state_dict()
    assert all(torch.equal(v, head[k]) for k, v in step2.head.state_dict().items())
    lef = step1.label_encoder.state_dict()
    fpn = {k: v for k, v in step2.backbone.state_dict().items() if not k.startswith("bottom_up.")}
    assert fpn and all(torch.equal(v, lef[k]) for k, v in fpn.items())


def test_detect_from_labels_runs_the_head_on_the_lef_alone_at_the_original_size():
    model = lef_only_step1("MODEL.FCOS.INFERENCE_TH_TEST", 0.0)  # untrained: keep all
    calls = _runs(model.backbone)
    inputs = [{**x, "height": 128, "width": 128} for x in batch()]  # twice the input size
    model.eval()
    with torch.no_grad():
        outputs = model.detect_from_labels(inputs)
    assert calls == [] and len(outputs) == 2
    for output in outputs:
        instances = output["instances"]
        assert instances.image_size == (128, 128) and len(instances) > 0
        assert instances.pred_boxes.tensor.max() > 64  # scaled to the original size
        assert set(instances.get_fields()) >= {"pred_boxes", "scores", "pred_classes"}
    with pytest.raises(ValueError, match="'instances' in every input dict"):
        model.detect_from_labels([{"image": x["image"]} for x in batch()])


# ------------------------------------------------------------------ step 2

@pytest.fixture
def step2():
    torch.manual_seed(0)
    return build_model(tiny_cfg(*STEP2,
                                         "MODEL.LABELENC.AUXILIARY_LOSS_ITERS", 3))


def _runs(*modules):
    """A list that gets an entry each time one of ``modules`` runs."""
    calls = []
    for module in modules:
        module.register_forward_hook(lambda *args: calls.append(1))
    return calls


def test_step2_auxiliary_loss_stops_after_its_iterations(step2):
    lef_calls = _runs(step2.label_encoder)
    with EventStorage(2):
        during = step2(batch())
    assert during["loss_labelenc_auxiliary"] > 0 and len(lef_calls) == 1
    with EventStorage(3):
        after = step2(batch())
    assert after["loss_labelenc_auxiliary"] == 0
    assert len(lef_calls) == 1  # no LEF at all once the auxiliary loss is off


def test_step2_lef_gets_no_gradient_and_keeps_its_weights(step2):
    lef_before = {k: v.clone() for k, v in step2.label_encoder.state_dict().items()}
    head_before = step2.head.cls_logits.weight.clone()
    optimizer = build_optimizer(tiny_cfg(), step2)
    for iteration in range(2):
        with EventStorage(iteration):
            losses = step2(batch())
        optimizer.zero_grad()
        sum(losses.values()).backward()
        assert all(p.grad is None and not p.requires_grad
                   for p in step2.label_encoder.parameters())
        optimizer.step()
    assert all(torch.equal(v, lef_before[k]) for k, v in step2.label_encoder.state_dict().items())
    assert not torch.equal(step2.head.cls_logits.weight, head_before)
    assert not step2.label_encoder.training and step2.training


def test_inference_runs_neither_lef_nor_adapter_and_the_weights_are_a_plain_fcos(step2):
    calls = _runs(step2.label_encoder, step2.adapter)
    step2.eval()
    with torch.no_grad():
        step2([{"image": x["image"]} for x in batch()])
    assert calls == []
    plain = build_model(tiny_cfg())
    weights = fcos_state_dict(step2.state_dict())
    plain.load_state_dict(weights)  # strict: nothing missing, nothing left over
    # same parameters, so the same FLOPs and latency as the plain FCOS
    assert sum(p.numel() for p in plain.parameters()) == sum(v.numel() for k, v in
                                                            weights.items() if "running" not in k
                                                            and "num_batches" not in k)


def test_step2_starts_from_step1_lef_head_and_the_lef_fpn(step2, tmp_path):
    torch.manual_seed(1)
    step1 = build_model(tiny_cfg(*STEP1))
    torch.save({"model": step1.state_dict()}, tmp_path / "step1.pth")
    init_step2_from_step1(step2, str(tmp_path / "step1.pth"))
    for name, value in step2.state_dict().items():
        if name.startswith(("label_encoder.", "head.")):
            assert torch.equal(value, step1.state_dict()[name]), name
    assert torch.equal(step2.backbone.fpn_lateral3.weight, step1.label_encoder.fpn_lateral3.weight)
    assert torch.equal(step2.backbone.top_block.p7.bias, step1.label_encoder.top_block.p7.bias)
    assert not torch.equal(step2.backbone.bottom_up.stem.conv1.weight,
                           step1.backbone.bottom_up.stem.conv1.weight)  # not the detector


def test_step2_backbone_from_step1_copies_the_step1_detectors_bottom_up(step2, tmp_path):
    torch.manual_seed(3)
    step1 = build_model(tiny_cfg(*STEP1))
    torch.save({"model": step1.state_dict()}, tmp_path / "step1.pth")
    init_step2_from_step1(step2, str(tmp_path / "step1.pth"), backbone_from_step1=True)
    own = step2.backbone.bottom_up.state_dict()
    assert own.keys() == step1.backbone.bottom_up.state_dict().keys()
    for name, value in step1.backbone.bottom_up.state_dict().items():
        assert torch.equal(own[name], value), name  # running BN statistics too
    # the FPN is still the LEF's, not step 1's detector FPN
    assert torch.equal(step2.backbone.fpn_lateral3.weight, step1.label_encoder.fpn_lateral3.weight)
    assert not torch.equal(step2.backbone.fpn_lateral3.weight, step1.backbone.fpn_lateral3.weight)


def test_step2_backbone_from_step1_refuses_an_official_file_naming_the_key(step2, tmp_path):
    torch.save(official_file(step2), tmp_path / "label_encoding_function.pth")
    with pytest.raises(CheckpointMismatchError, match=r"label_encoding_function\.pth: MODEL\."
                       r"LABELENC\.STEP2_BACKBONE 'step1' needs step 1's detector"):
        init_step2_from_step1(step2, str(tmp_path / "label_encoding_function.pth"),
                              backbone_from_step1=True)


def test_step2_refuses_a_step1_file_of_another_lef_width_naming_file_and_keys(step2, tmp_path):
    step1 = build_model(tiny_cfg(*STEP1, "MODEL.LABELENC.LEF_WIDTH", 8))
    torch.save({"model": step1.state_dict()}, tmp_path / "step1.pth")
    with pytest.raises(CheckpointMismatchError, match=r"step1\.pth \(MODEL\.LABELENC\.WEIGHTS\)"
                       r": the label encoder(.|\n)*bottom_up\.stem\.weight \(16, 3, 7, 7\) vs "
                       r"\(32, 3, 7, 7\)"):
        init_step2_from_step1(step2, str(tmp_path / "step1.pth"))
    with pytest.raises(ValueError, match="MODEL.LABELENC.WEIGHTS: step 2 needs"):
        init_step2_from_step1(step2, "")


# ------------------------------------------------------------------ the official file

def official_name(key: str) -> str:
    """The official LabelEnc name of a fcos-d2 ``label_encoder.*`` key (official: stages 2
    and 5 are single blocks, stages 3 and 4 sequences)."""
    key = key[len("label_encoder."):]
    key = key.replace("bottom_up.stem.", "body.stage1.")
    match = re.match(r"bottom_up\.res(\d)\.(\d)\.(\w+)\.(\w+)$", key)
    if match:
        stage, block, conv, param = match.groups()
        index = f"{block}." if stage in "34" else ""
        conv = "downsample.0" if conv == "shortcut" else conv.replace("conv", "con")
        return f"body.stage{stage}.{index}{conv}.{param}"
    key = re.sub(r"fpn_lateral(\d)", lambda m: f"fpn.fpn_inner{int(m[1]) - 1}", key)
    key = re.sub(r"fpn_output(\d)", lambda m: f"fpn.fpn_layer{int(m[1]) - 1}", key)
    return key.replace("top_block.", "fpn.top_blocks.")


def official_file(model):
    """The official step-1 layout, generated from ``model``'s LEF and head."""
    state = model.state_dict()
    return {"label_encoding_function": {official_name(k): v for k, v in state.items()
                                        if k.startswith("label_encoder.")},
            "rpn": {k: v for k, v in state.items() if k.startswith("head.")}}


def test_official_lef_keys_map_to_fcos_d2_names():
    assert convert_official_lef_key("body.stage1.weight") == "label_encoder.bottom_up.stem.weight"
    assert convert_official_lef_key("body.stage2.con1.bias") == \
        "label_encoder.bottom_up.res2.0.conv1.bias"
    assert convert_official_lef_key("body.stage3.1.con3.weight") == \
        "label_encoder.bottom_up.res3.1.conv3.weight"
    assert convert_official_lef_key("body.stage5.downsample.0.weight") == \
        "label_encoder.bottom_up.res5.0.shortcut.weight"
    assert convert_official_lef_key("fpn.fpn_inner2.weight") == "label_encoder.fpn_lateral3.weight"
    assert convert_official_lef_key("fpn.fpn_layer4.bias") == "label_encoder.fpn_output5.bias"
    assert convert_official_lef_key("fpn.top_blocks.p6.weight") == \
        "label_encoder.top_block.p6.weight"


def test_an_official_step1_file_converts_to_exactly_the_step2_lef_and_head(step2, tmp_path):
    torch.manual_seed(2)
    step1 = build_model(tiny_cfg(*STEP1))
    official = official_file(step1)
    assert "body.stage3.1.con2.weight" in official["label_encoding_function"]
    converted = convert_official_labelenc(official)
    expected = {k: v for k, v in step1.state_dict().items()
                if k.startswith(("label_encoder.", "head."))}
    assert converted.keys() == expected.keys()
    assert all(torch.equal(converted[k], v) for k, v in expected.items())
    torch.save({**official, "roi_heads": {}}, tmp_path / "label_encoding_function.pth")
    init_step2_from_step1(step2, str(tmp_path / "label_encoding_function.pth"))  # on the fly
    assert torch.equal(step2.label_encoder.bottom_up.res4[1].conv2.weight,
                       step1.label_encoder.bottom_up.res4[1].conv2.weight)


def test_official_conversion_errors_name_what_is_wrong(step2):
    official = official_file(step2)
    with pytest.raises(CheckpointMismatchError, match=r"missing \['rpn'\], unexpected \['x'\]"):
        convert_official_labelenc({"label_encoding_function": {}, "x": {}})
    with pytest.raises(CheckpointMismatchError, match="'roi_heads' holds 1 tensors: a step-1 "
                                                      "file of a two-stage model"):
        convert_official_labelenc({**official, "roi_heads": {"box.weight": torch.zeros(1)}})
    official["label_encoding_function"]["body.stage6.con1.weight"] = torch.zeros(1)
    official["rpn"]["head.mystery.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointMismatchError, match="2 keys of the official LabelEnc file have "
                       "no fcos-d2 name: label_encoding_function/body.stage6.con1.weight, "
                       "rpn/head.mystery.weight"):
        convert_official_labelenc(official)


# ------------------------------------------------------------------ config

@pytest.mark.parametrize("key, value, message", [
    ("MODEL.LABELENC.STEP", 3, "MODEL.LABELENC.STEP: unknown 3"),
    ("MODEL.LABELENC.LEF_DEPTH", [1, 2], "MODEL.LABELENC.LEF_DEPTH: 4 block counts"),
    ("MODEL.LABELENC.LEF_WIDTH", 0, "MODEL.LABELENC.LEF_WIDTH: must be >= 1"),
    ("MODEL.LABELENC.STEP2_BACKBONE", "imagenet",
     "MODEL.LABELENC.STEP2_BACKBONE: unknown 'imagenet'"),
    ("MODEL.LABELENC.DISTANCE_LOSS_WEIGHT", -1.0, "MODEL.LABELENC.DISTANCE_LOSS_WEIGHT: must be"),
    ("MODEL.META_ARCHITECTURE", "GeneralizedRCNN", "MODEL.LABELENC.STEP 1 trains an FCOS"),
    ("MODEL.LABELENC.STEP1_DETECTOR", False,
     "MODEL.LABELENC.DISTANCE_LOSS_WARMUP_ITERS: must be 0 with STEP1_DETECTOR False"),
])
def test_bad_labelenc_settings_are_refused_naming_the_key(key, value, message):
    opts = [key, value] if key.endswith("STEP") else [*STEP1, key, value]
    with pytest.raises(ValueError, match=re.escape(message)):
        Trainer.build_model(tiny_cfg(*opts))  # the trainer checks, whatever the META_ARCH


@pytest.mark.parametrize("opts, message", [
    (["MODEL.LABELENC.STEP", 2], "MODEL.LABELENC.STEP 2 trains an FCOS with LabelEnc's step 2: "
                                 "MODEL.META_ARCHITECTURE must be 'LabelEncStep2', got 'FCOS'"),
    (["MODEL.META_ARCHITECTURE", "LabelEncStep1"],
     "MODEL.META_ARCHITECTURE 'LabelEncStep1' is LabelEnc's step 1, but MODEL.LABELENC.STEP "
     "is 0"),
    ([*STEP1, "MODEL.META_ARCHITECTURE", "LabelEncStep2"],
     "MODEL.LABELENC.STEP 1 trains an FCOS with LabelEnc's step 1: MODEL.META_ARCHITECTURE "
     "must be 'LabelEncStep1', got 'LabelEncStep2'"),
])
def test_a_step_and_meta_architecture_that_disagree_are_refused_naming_both(opts, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Trainer.build_model(tiny_cfg(*opts))


def test_detectron2_build_model_builds_each_step_from_its_meta_architecture():
    assert type(build_model(tiny_cfg(*STEP1))) is LabelEncStep1
    assert type(build_model(tiny_cfg(*STEP2))) is LabelEncStep2


def test_step1_schedule_gets_the_warmup_added_and_the_others_do_not():
    cfg = tiny_cfg("SOLVER.MAX_ITER", 90000, "SOLVER.STEPS", (60000, 80000),
                   "MODEL.LABELENC.DISTANCE_LOSS_WARMUP_ITERS", 30000)
    extend_step1_schedule(cfg)
    assert (cfg.SOLVER.MAX_ITER, cfg.SOLVER.STEPS) == (90000, (60000, 80000))  # step 0
    cfg.MODEL.LABELENC.STEP = 1
    extend_step1_schedule(cfg)
    assert (cfg.SOLVER.MAX_ITER, cfg.SOLVER.STEPS) == (120000, (90000, 110000))


def run_tool(monkeypatch, *argv):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "convert_official_labelenc", REPO / "tools" / "convert_official_labelenc.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    monkeypatch.setattr("sys.argv", ["convert_official_labelenc.py", *map(str, argv)])
    tool.main()


def test_converter_tool_checks_the_official_file_against_a_config(monkeypatch, tmp_path, capsys):
    config = REPO / "configs" / "LabelEnc" / "FCOS-R18-small-data-step2.yaml"
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(config))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", *STEP1])
    torch.save(official_file(LabelEncStep1(cfg)), tmp_path / "official.pth")
    run_tool(monkeypatch, tmp_path / "official.pth", tmp_path / "step1.pth",
             "--config-file", config)
    assert "wrote" in capsys.readouterr().out
    converted = torch.load(tmp_path / "step1.pth", weights_only=True)["model"]
    assert converted.keys() == {k for k in LabelEncStep1(cfg).state_dict()
                                if k.startswith(("label_encoder.", "head."))}
    torch.save(official_file(build_model(tiny_cfg(*STEP1))),
               tmp_path / "other.pth")  # 3 classes, a narrower FPN and head
    with pytest.raises(SystemExit, match=r"other\.pth: the LEF and head of .*FCOS-R18-small-"
                                         r"data-step2\.yaml's model does not match the model"):
        run_tool(monkeypatch, tmp_path / "other.pth", tmp_path / "x.pth", "--config-file", config)


def test_converter_tool_strips_a_labelenc_checkpoint_to_plain_fcos(monkeypatch, tmp_path, step2):
    torch.save({"model": step2.state_dict(), "iteration": 5}, tmp_path / "model_0000005.pth")
    run_tool(monkeypatch, "--fcos-only", tmp_path / "model_0000005.pth", tmp_path / "fcos.pth")
    build_model(tiny_cfg()).load_state_dict(
        torch.load(tmp_path / "fcos.pth", weights_only=True)["model"])  # strict
