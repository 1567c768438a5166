"""Equality with the official FCOS, proven on its stored inputs and outputs.

For every case folder under $FCOS_REFERENCE_DIR (default ../shared/reference): the model
built from the case's settings, with the official checkpoint converted by our converter,
reproduces the official targets, losses, head outputs and detections.
"""
import json

import pytest
import torch

from fcos_d2.modeling.assignment import assign_targets, compute_locations
from fcos_d2.checkpoint import check_matches_model, convert_official_state_dict
from fcos_d2.modeling.losses import fcos_losses
from fcos_d2.modeling.meta_arch import flatten_levels
from detectron2.modeling import build_model

from reference_case import case_dirs, config_for_case, reference_dir

CASES = case_dirs()
if not CASES:
    pytest.skip(f"no reference cases: {reference_dir()} is missing or has no case.json "
                "(set FCOS_REFERENCE_DIR)", allow_module_level=True)


class Case:
    def __init__(self, folder):
        self.name = folder.name
        self.settings = json.loads((folder / "case.json").read_text())
        self.vectors = torch.load(folder / "vectors.pt", weights_only=True)
        official = torch.load(folder / "official_fp16.pth", weights_only=True)["model"]
        self.cfg = config_for_case(self.settings)
        torch.manual_seed(0)
        self.model = build_model(self.cfg)
        weights = convert_official_state_dict(official)
        check_matches_model(weights, self.model)  # zero missing, zero unexpected keys
        self.model.load_state_dict(weights, strict=True)


@pytest.fixture(scope="module", params=CASES, ids=[c.name for c in CASES])
def case(request):
    return Case(request.param)


def _official_targets(case: Case):
    """Our targets on the reference batch, as per-level official tensors (1-based labels)."""
    v, model = case.vectors, case.model
    shapes = [x.shape[-2:] for x in v["head_cls_logits"]]
    locations = compute_locations(shapes, model.strides, torch.device("cpu"))
    labels, reg_targets = assign_targets(
        locations, v["gt_boxes"], [c - 1 for c in v["gt_classes_1based"]],
        strides=model.strides, size_ranges=model.size_ranges,
        center_sampling_radius=model.center_sampling_radius, num_classes=model.num_classes,
        norm_reg_targets=model.norm_reg_targets)  # (N, R), (N, R, 4)
    return locations, labels, reg_targets


def test_strides_and_locations_equal_official(case):
    v = case.vectors
    assert case.model.strides == v["strides"].tolist() == case.settings["fpn_strides"]
    locations, _, _ = _official_targets(case)
    for ours, official in zip(locations, v["locations"]):
        torch.testing.assert_close(ours, official.float(), rtol=0, atol=0)


def test_targets_equal_official(case):
    v, num_classes = case.vectors, case.model.num_classes
    locations, labels, reg_targets = _official_targets(case)
    official_labels = torch.where(labels == num_classes, 0, labels + 1)  # 1-based, 0 = bg
    start = 0
    for level, count in enumerate(len(x) for x in locations):
        ours_labels = official_labels[:, start:start + count].reshape(-1)  # (N * HiWi,)
        ours_reg = reg_targets[:, start:start + count].reshape(-1, 4)
        assert torch.equal(ours_labels, v["target_labels_1based"][level].long()), f"level {level}"
        assert (ours_labels > 0).any() or level > 2
        torch.testing.assert_close(ours_reg, v["target_reg"][level], rtol=0, atol=1e-4)
        start += count


def test_losses_from_official_head_outputs_equal_official(case):
    v, model = case.vectors, case.model
    _, labels, reg_targets = _official_targets(case)
    losses = fcos_losses(
        logits=flatten_levels(v["head_cls_logits"]), reg_pred=flatten_levels(v["head_bbox_reg"]),
        ctr_logits=flatten_levels(v["head_centerness"])[..., 0], labels=labels,
        reg_targets=reg_targets, num_classes=model.num_classes,
        focal_alpha=model.focal_loss_alpha, focal_gamma=model.focal_loss_gamma,
        loc_loss_type=model.loc_loss_type)
    official = case.settings["losses"]
    for ours_key, official_key in [("loss_fcos_cls", "loss_cls"), ("loss_fcos_loc", "loss_reg"),
                                   ("loss_fcos_ctr", "loss_centerness")]:
        expected = v[official_key].item()
        assert expected == pytest.approx(official[official_key], rel=1e-6)
        assert losses[ours_key].item() == pytest.approx(expected, rel=1e-4), ours_key


def _batched_inputs(case: Case, indices):
    v = case.vectors
    return [{"image": v["images_bgr"][i].float(), "height": int(v["image_sizes"][i, 0]),
             "width": int(v["image_sizes"][i, 1])} for i in indices]


def _max_relative_error(ours: torch.Tensor, official: torch.Tensor) -> float:
    """max |ours - official| over max |official|: a scale-free error of a whole tensor."""
    return ((ours - official).abs().max() / official.abs().max()).item()


def test_head_outputs_from_images_equal_official(case):
    v, model = case.vectors, case.model
    model.train()
    with torch.no_grad():
        images = model.preprocess_image(_batched_inputs(case, range(len(v["images_bgr"]))))
        outputs = model.forward_head(images)
    names = ["head_cls_logits", "head_bbox_reg", "head_centerness"]
    for name, ours_levels in zip(names, outputs):
        for level, (ours, official) in enumerate(zip(ours_levels, v[name])):
            assert ours.shape == official.shape, (name, level)
            error = _max_relative_error(ours, official)
            assert error <= 1e-3, f"{name} level {level}: relative error {error:.2e}"


def _clamped(boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The official clipping, [0, W - 1] x [0, H - 1], applied to both sides."""
    limits = boxes.new_tensor([width - 1, height - 1, width - 1, height - 1])
    return torch.minimum(boxes.clamp(min=0), limits)


def _unmatched(ours, official, height, width):
    """Official detections without a partner among ours (same label, score within 1e-4,
    box within 0.01 px), each of ours used once."""
    ours_boxes, ours_scores, ours_labels = ours
    ours_boxes = _clamped(ours_boxes, height, width)
    used = torch.zeros(len(ours_scores), dtype=torch.bool)
    missing = []
    for box, score, label in zip(_clamped(official[0], height, width), *official[1:]):
        close = (~used & (ours_labels == label) & ((ours_scores - score).abs() <= 1e-4)
                 & ((ours_boxes - box).abs().max(dim=1).values <= 0.01))
        if close.any():
            used[close.nonzero()[0, 0]] = True
        else:
            missing.append((box.tolist(), score.item(), label.item()))
    return missing


def test_detections_equal_official_as_a_set(case):
    v, model = case.vectors, case.model
    model.eval()
    for i in range(len(v["images_bgr"])):
        with torch.no_grad():
            instances = model(_batched_inputs(case, [i]))[0]["instances"]
        height, width = v["image_sizes"][i].tolist()
        official = (v["det_boxes"][i], v["det_scores"][i], v["det_labels_1based"][i] - 1)
        assert len(instances) == len(official[1])
        ours = (instances.pred_boxes.tensor, instances.scores, instances.pred_classes)
        missing = _unmatched(ours, official, height, width)
        assert not missing, f"image {i}: {len(missing)} official detections unmatched: {missing[:3]}"
