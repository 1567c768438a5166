"""Losses on small inputs computed by hand, including batches without positives."""
import math

import pytest
import torch
from torchvision.ops import sigmoid_focal_loss

from fcos_d2.modeling.losses import centerness_targets, fcos_losses, iou_loss, mean_over_workers

K = 3


def _losses(labels, logits=None, reg_pred=None, reg_targets=None, loss_type="giou"):
    n, r = labels.shape
    logits = torch.zeros(n, r, K) if logits is None else logits
    reg_pred = torch.ones(n, r, 4) if reg_pred is None else reg_pred
    reg_targets = torch.ones(n, r, 4) if reg_targets is None else reg_targets
    return fcos_losses(logits=logits, reg_pred=reg_pred, ctr_logits=torch.zeros(n, r),
                       labels=labels, reg_targets=reg_targets, num_classes=K,
                       focal_alpha=0.25, focal_gamma=2.0, loc_loss_type=loss_type)


def test_centerness_target_is_geometric_mean_of_side_ratios():
    targets = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0]])
    assert centerness_targets(targets).tolist() == pytest.approx([math.sqrt(1 / 6), 1.0])


def test_iou_loss_uses_plus_one_smoothing():
    pred, target = torch.tensor([[1.0, 1, 1, 1]]), torch.tensor([[2.0, 2, 2, 2]])
    weight = torch.ones(1)
    # pred area 4, target area 16, intersection 4, union 16 -> IoU (4 + 1) / (16 + 1)
    assert iou_loss(pred, target, weight, "iou").item() == pytest.approx(-math.log(5 / 17))
    assert iou_loss(pred, target, weight, "linear_iou").item() == pytest.approx(1 - 5 / 17)
    # the enclosing box equals the target box: GIoU adds nothing
    assert iou_loss(pred, target, weight, "giou").item() == pytest.approx(1 - 5 / 17)


def test_giou_penalises_the_empty_part_of_the_enclosing_box():
    pred, target = torch.tensor([[0.0, 1, 2, 1]]), torch.tensor([[2.0, 1, 0, 1]])
    # pred spans x in [0, 2], target x in [-2, 0] (around the same point): intersection 0,
    # union 8, enclosing 4 x 2 = 8 -> GIoU = 1/9 - 0.
    loss = iou_loss(pred, target, torch.ones(1), "giou").item()
    assert loss == pytest.approx(1 - 1 / 9, rel=1e-6)


def test_unknown_box_loss_type_names_the_key():
    with pytest.raises(ValueError, match="LOC_LOSS_TYPE.*'smooth_l1'"):
        iou_loss(torch.ones(1, 4), torch.ones(1, 4), torch.ones(1), "smooth_l1")


def test_zero_positives_give_finite_losses_and_zero_box_losses():
    logits = torch.randn(2, 6, K, requires_grad=True)
    losses = _losses(torch.full((2, 6), K), logits=logits)
    assert losses["loss_fcos_loc"].item() == 0 and losses["loss_fcos_ctr"].item() == 0
    expected = sigmoid_focal_loss(logits.detach().reshape(-1, K), torch.zeros(12, K),
                                  reduction="sum")  # divided by max(0, 1) = 1
    assert losses["loss_fcos_cls"].item() == pytest.approx(expected.item(), rel=1e-6)
    sum(losses.values()).backward()
    assert torch.isfinite(logits.grad).all()


def test_one_worker_divides_by_positive_count_and_centerness_sum():
    labels = torch.tensor([[0, K, 2, K]])
    targets = torch.tensor([[[1.0, 2, 3, 4], [1, 1, 1, 1], [5, 5, 5, 5], [1, 1, 1, 1]]])
    logits = torch.randn(1, 4, K)
    losses = _losses(labels, logits=logits, reg_pred=targets, reg_targets=targets,
                     loss_type="linear_iou")
    one_hot = torch.zeros(4, K)
    one_hot[0, 0] = one_hot[2, 2] = 1
    focal = sigmoid_focal_loss(logits.reshape(-1, K), one_hot, reduction="sum")
    assert losses["loss_fcos_cls"].item() == pytest.approx(focal.item() / 2, rel=1e-6)
    # perfect boxes: linear IoU loss 0; centerness logits 0 -> BCE(0, c) = log 2 per positive
    assert losses["loss_fcos_loc"].item() == pytest.approx(0, abs=1e-7)
    assert losses["loss_fcos_ctr"].item() == pytest.approx(math.log(2), rel=1e-6)


def test_mean_over_one_worker_is_the_value():
    assert mean_over_workers(7.0) == 7.0


@pytest.mark.parametrize("gamma", [2.0, 1.5, 0.0])
def test_sparse_focal_loss_equals_torchvision_focal_loss_on_one_hot_targets(gamma):
    from fcos_d2.modeling.losses import sigmoid_focal_loss_sparse

    torch.manual_seed(0)
    logits = torch.randn(50, K) * 4
    labels = torch.randint(0, K + 1, (50,))  # K = background
    one_hot = torch.zeros(50, K)
    one_hot[labels < K, labels[labels < K]] = 1
    expected = sigmoid_focal_loss(logits, one_hot, alpha=0.25, gamma=gamma, reduction="sum")
    ours = sigmoid_focal_loss_sparse(logits, labels, alpha=0.25, gamma=gamma)
    assert ours.item() == pytest.approx(expected.item(), rel=1e-5)


def test_iou_smoothing_zero_gives_the_exact_iou():
    pred, target = torch.tensor([[1.0, 1, 1, 1]]), torch.tensor([[2.0, 2, 2, 2]])
    # intersection 4, union 16: IoU 1/4 exactly, against (4 + 1) / (16 + 1) with smoothing
    assert iou_loss(pred, target, torch.ones(1), "linear_iou", smooth=0.0).item() == \
        pytest.approx(0.75)
    assert iou_loss(pred, target, torch.ones(1), "iou", smooth=0.0).item() == \
        pytest.approx(math.log(4))


def test_iou_smoothing_zero_with_zero_prediction_is_finite():
    # a dead regression predicts (0, 0, 0, 0): IoU 0, -log guarded, no NaN gradient
    pred = torch.zeros(1, 4, requires_grad=True)
    loss = iou_loss(pred, torch.ones(1, 4), torch.ones(1), "iou", smooth=0.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(pred.grad).all()


def _two_positive_losses(logits=None, **options):
    """Linear-IoU losses, exact IoU, of a batch with positives 0 (IoU 4 / 8 exactly, loss
    1/2, centerness target sqrt(1/3)) and 2 (perfect box, centerness 1)."""
    labels = torch.tensor([[0, K, 2, K]])
    targets = torch.tensor([[[1.0, 1, 3, 1], [1, 1, 1, 1], [2, 2, 2, 2], [1, 1, 1, 1]]])
    pred = targets.clone()
    pred[0, 0] = torch.tensor([1.0, 1, 1, 1])
    logits = torch.zeros(1, 4, K) if logits is None else logits
    return fcos_losses(logits=logits, reg_pred=pred, ctr_logits=torch.zeros(1, 4), labels=labels,
                       reg_targets=targets, num_classes=K, focal_alpha=0.25, focal_gamma=2.0,
                       loc_loss_type="linear_iou", iou_smooth=0.0, **options)


def test_unweighted_box_loss_is_the_mean_over_positives():
    losses = _two_positive_losses(loc_weighting="none")
    assert losses["loss_fcos_loc"].item() == pytest.approx((0.5 + 0.0) / 2)


def test_centerness_weighted_box_loss_divides_by_the_weight_sum():
    losses = _two_positive_losses()
    ctr0 = math.sqrt(1 / 3)  # (1, 1, 3, 1): min/max of l, r = 1/3; of t, b = 1
    assert losses["loss_fcos_loc"].item() == pytest.approx(0.5 * ctr0 / (ctr0 + 1.0))


def test_ema_normalizer_starts_at_its_initial_value_and_moves_by_the_momentum():
    from fcos_d2.modeling.losses import EMANormalizer

    ema = EMANormalizer(initial=100.0, momentum=0.9)
    # first batch: 10 positives of mean weight 0.5 -> weight sum starts at 100 * 0.5
    assert ema(10.0, 5.0) == pytest.approx((0.9 * 100 + 1.0, 0.9 * 50 + 0.5))
    assert ema(10.0, 5.0) == pytest.approx((0.9 * 91 + 1.0, 0.9 * 45.5 + 0.5))


def test_a_restored_ema_normalizer_goes_on_bit_for_bit():
    from fcos_d2.modeling.losses import EMANormalizer

    ema, weights = EMANormalizer(initial=300.0, momentum=0.99), torch.tensor(7.3)
    assert ema.state_dict() == {"values": None}  # before the first batch
    ema(13.0, weights)
    restored = EMANormalizer(initial=300.0, momentum=0.99)
    restored.load_state_dict(ema.state_dict())
    fresh = EMANormalizer(initial=300.0, momentum=0.99)  # what a resume did before
    for positives in (9.0, 31.0):
        want = ema(positives, weights * positives)
        got = restored(positives, weights * positives)
        assert float(got[0]) == float(want[0]) and float(got[1]) == float(want[1])
        assert fresh(positives, weights * positives)[0] != want[0]


def test_normalizer_states_are_found_by_module_and_report_what_does_not_match():
    from torch import nn

    from fcos_d2.modeling.losses import (EMANormalizer, load_loss_normalizer_states,
                                         loss_normalizer_states)

    def model(*with_ema):
        parts = nn.ModuleDict({name: nn.Module() for name in ("detector", "label_encoder")})
        for name in with_ema:
            parts[name].loss_normalizer = EMANormalizer(initial=50.0, momentum=0.9)
        return parts

    trained = model("detector", "label_encoder")
    trained["detector"].loss_normalizer(5.0, 2.0)
    states = loss_normalizer_states(trained)  # weight sum: 0.9 * (50 * 2 / 5) + 0.1 * 2
    assert states == {"detector": {"values": pytest.approx([45.5, 18.2])},
                      "label_encoder": {"values": None}}
    other = model("detector")
    assert load_loss_normalizer_states(other, states) == ([], ["label_encoder"])
    assert other["detector"].loss_normalizer.values == tuple(states["detector"]["values"])
    assert load_loss_normalizer_states(model("detector", "label_encoder"),
                                       {"detector": states["detector"]}) == (["label_encoder"], [])


def test_ema_normalizer_divides_all_three_losses_by_the_smoothed_values():
    from fcos_d2.modeling.losses import EMANormalizer

    logits = torch.randn(1, 4, K)
    plain = _two_positive_losses(logits, loc_weighting="none")  # divides by 2 positives
    smoothed = _two_positive_losses(logits, loc_weighting="none",
                                    normalizer=EMANormalizer(initial=20.0, momentum=0.9))
    divisor = 0.9 * 20 + 0.1 * 2  # 18.2, for the positives and (weights 1) the weight sum
    for key in plain:
        assert smoothed[key].item() == pytest.approx(plain[key].item() * 2 / divisor, rel=1e-6)
