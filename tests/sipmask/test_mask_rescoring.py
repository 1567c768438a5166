"""SipMask++'s mask re-scoring (MODEL.SIPMASK.MASK_RESCORING): it changes the scores, not
the masks, and trains on a tiny config."""
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import BitMasks, Boxes, Instances
from detectron2.utils.events import EventStorage

from fcos_d2 import add_fcos_config
from fcos_d2.config import get_config_file
from fcos_d2.modeling.sipmask.scoring import MaskScoring, mask_iou_targets, rescore


def tiny_model(*opts):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(get_config_file("quickstart-sipmask.yaml"))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.FPN.OUT_CHANNELS", "32",
                         "MODEL.SIPMASK.NUM_BASIS", "8", "MODEL.SIPMASK.BASIS_HIDDEN_CHANNELS",
                         "32", "MODEL.FCOS.CHANNELS_LAST", "False",
                         "MODEL.FCOS.INFERENCE_TH_TEST", "0.0", *opts])
    torch.manual_seed(0)
    return build_model(cfg)


def sample(size: int = 64):
    """Two rectangles of 24 x 32 and 24 x 30 pixels (192 and 180 cells at stride 2)."""
    masks = torch.zeros(2, size, size, dtype=torch.bool)
    masks[0, 8:40, 4:28] = True
    masks[1, 30:60, 36:60] = True
    instances = Instances((size, size))
    instances.gt_boxes = Boxes(torch.tensor([[4.0, 8, 28, 40], [36, 30, 60, 60]]))
    instances.gt_classes = torch.tensor([0, 2])
    instances.gt_masks = BitMasks(masks)
    image = (masks.any(0) * 200).to(torch.uint8).expand(3, size, size).clone()
    return {"image": image, "instances": instances}


def test_rescoring_multiplies_the_scores_by_the_predicted_iou_and_keeps_the_masks():
    model = tiny_model("MODEL.SIPMASK.MASK_RESCORING", "True",
                       "MODEL.SIPMASK.MASK_RESCORING_SCOPE", "all").eval()
    torch.nn.init.constant_(model.mask_scoring.iou.bias, 0.5)  # predicted IoUs above 0
    inputs = [{"image": sample()["image"], "height": 64, "width": 64}]
    with torch.no_grad():
        (rescored,) = model(inputs)
        scoring, model.mask_scoring = model.mask_scoring, None
        (plain,) = model(inputs)
    rescored, plain = rescored["instances"], plain["instances"]
    assert len(plain) > 0
    assert torch.equal(rescored.pred_masks, plain.pred_masks)
    assert torch.equal(rescored.pred_boxes.tensor, plain.pred_boxes.tensor)
    ratio = rescored.scores / plain.scores
    assert (ratio > 0).all() and not torch.allclose(rescored.scores, plain.scores)
    assert not torch.allclose(ratio, ratio[0].expand_as(ratio))  # one IoU per mask


def test_iou_targets_count_only_large_objects_with_some_overlap():
    # Object of 10 x 10 cells; a mask covering 10 x 5 of it: IoU 50 / (50 + 100 - 50 + 0.1).
    truth = torch.zeros(3, 16, 16)
    truth[:2, :10, :10] = 1.0
    truth[2, :5, :5] = 1.0  # 25 cells: below the 100 that count
    probs = torch.zeros(3, 16, 16)
    probs[0, :10, :5] = 0.9
    probs[1, 12:, 12:] = 0.9  # no overlap: IoU 0, not counted
    probs[2, :5, :5] = 0.9
    iou, weights = mask_iou_targets(probs, truth)
    assert iou[0].item() == torch.tensor(50 / 100.1).item()
    assert weights.tolist() == [1.0, 0.0, 0.0]


def test_a_tiny_config_trains_with_rescoring():
    model = tiny_model("MODEL.SIPMASK.MASK_RESCORING", "True").train()
    torch.nn.init.constant_(model.head.bbox_pred.bias, 2.0)  # boxes wider than a cell
    before = {k: v.clone() for k, v in model.mask_scoring.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with EventStorage():
        for _ in range(2):
            losses = model([sample(), sample()])
            assert "loss_sipmask_rescoring" in losses
            assert all(torch.isfinite(v) for v in losses.values())
            optimizer.zero_grad()
            sum(losses.values()).backward()
            optimizer.step()
    assert losses["loss_sipmask_rescoring"] > 0
    after = model.mask_scoring.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert isinstance(model.mask_scoring, MaskScoring)


def test_the_trained_scope_rescores_only_boxes_of_the_sizes_the_branch_trains_on():
    scores, iou = torch.tensor([0.8, 0.8, 0.5]), torch.tensor([0.5, 0.5, 0.2])
    # 20 x 20 px: 100 cells at stride 2 (re-scored); 19 x 20: 95 cells (kept); 40 x 10: 100
    boxes = torch.tensor([[0.0, 0, 20, 20], [0, 0, 19, 20], [5, 5, 45, 15]])
    assert torch.allclose(rescore(scores, iou, boxes, 2), torch.tensor([0.4, 0.8, 0.1]))
    assert torch.allclose(rescore(scores, iou), torch.tensor([0.4, 0.4, 0.1]))  # "all"
    assert rescore(scores, None, boxes, 2) is scores


def test_the_default_scope_leaves_small_detections_as_scored_and_bad_scopes_are_refused():
    model = tiny_model("MODEL.SIPMASK.MASK_RESCORING", "True").eval()
    torch.nn.init.constant_(model.mask_scoring.iou.bias, 0.5)
    inputs = [{"image": sample()["image"], "height": 64, "width": 64}]
    with torch.no_grad():
        (rescored,) = model(inputs)
        model.mask_scoring = None
        (plain,) = model(inputs)
    rescored, plain = rescored["instances"], plain["instances"]
    boxes = plain.pred_boxes.tensor
    small = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) < 400
    assert small.any() and (~small).any()  # both kinds among the detections
    assert torch.equal(rescored.scores[small], plain.scores[small])
    assert not torch.allclose(rescored.scores[~small], plain.scores[~small])
    with pytest.raises(ValueError, match="MODEL.SIPMASK.MASK_RESCORING_SCOPE: 'some'"):
        tiny_model("MODEL.SIPMASK.MASK_RESCORING_SCOPE", "some")
