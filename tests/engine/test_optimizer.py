"""SOLVER.OPTIMIZER: detectron2's SGD by default, AdamW with the same parameter groups."""
import pytest
import torch
from detectron2.config import get_cfg
from torch import nn

from fcos_d2 import add_fcos_config
from fcos_d2.engine.optimizer import build_optimizer


def solver_cfg(*opts):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_list(["SOLVER.BASE_LR", 0.001, "SOLVER.WEIGHT_DECAY", 0.05,
                         "SOLVER.WEIGHT_DECAY_NORM", 0.0, "SOLVER.BIAS_LR_FACTOR", 2.0,
                         "SOLVER.WEIGHT_DECAY_BIAS", 0.0, *opts])
    return cfg


def tiny_model():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.Conv2d(4, 2, 1))


def test_default_is_detectrons_sgd():
    optimizer = build_optimizer(solver_cfg(), tiny_model())
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.defaults["momentum"] == 0.9


def test_adamw_keeps_detectrons_parameter_groups():
    model = tiny_model()
    optimizer = build_optimizer(solver_cfg("SOLVER.OPTIMIZER", "ADAMW",
                                           "SOLVER.ADAMW_BETAS", (0.8, 0.99)), model)
    assert isinstance(optimizer, torch.optim.AdamW)
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    conv, norm = model[0], model[1]
    assert groups[id(conv.weight)]["weight_decay"] == 0.05
    assert groups[id(conv.weight)]["lr"] == 0.001
    assert groups[id(conv.bias)]["lr"] == pytest.approx(0.002)  # BIAS_LR_FACTOR
    assert groups[id(conv.bias)]["weight_decay"] == 0.0  # WEIGHT_DECAY_BIAS
    assert groups[id(norm.weight)]["weight_decay"] == 0.0  # WEIGHT_DECAY_NORM
    assert optimizer.defaults["betas"] == (0.8, 0.99)


def test_adamw_steps_like_torchs_adamw_with_the_fused_kernel():
    torch.manual_seed(0)
    model = tiny_model()
    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]
    ours = build_optimizer(solver_cfg("SOLVER.OPTIMIZER", "ADAMW", "SOLVER.BIAS_LR_FACTOR", 1.0,
                                      "SOLVER.WEIGHT_DECAY_NORM", 0.05,
                                      "SOLVER.WEIGHT_DECAY_BIAS", 0.05), model)
    theirs = torch.optim.AdamW(reference, lr=0.001, weight_decay=0.05)  # the loop kernel
    assert ours.defaults["fused"] is True  # one kernel for all parameters on the CPU
    x = torch.randn(2, 3, 8, 8)
    for _ in range(3):
        for params, optimizer in ((list(model.parameters()), ours), (reference, theirs)):
            optimizer.zero_grad()
            out = x
            out = nn.functional.conv2d(out, params[0], params[1])
            out = nn.functional.group_norm(out, 2, params[2], params[3])
            out = nn.functional.conv2d(out, params[4], params[5])
            out.square().mean().backward()
            optimizer.step()
    for mine, expected in zip(model.parameters(), reference):
        torch.testing.assert_close(mine, expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize("opts, message", [
    (["SOLVER.OPTIMIZER", "ADAM"], "SOLVER.OPTIMIZER: unknown 'ADAM'"),
    (["SOLVER.OPTIMIZER", "ADAMW", "SOLVER.ADAMW_BETAS", (0.9, 1.0)], "SOLVER.ADAMW_BETAS"),
])
def test_bad_optimizer_settings_name_the_key(opts, message):
    with pytest.raises(ValueError, match=message):
        build_optimizer(solver_cfg(*opts), tiny_model())


def test_train_net_builds_the_configured_optimizer():
    from fcos_d2.engine.trainer import Trainer

    model = tiny_model()
    assert isinstance(Trainer.build_optimizer(solver_cfg("SOLVER.OPTIMIZER", "ADAMW"), model),
                      torch.optim.AdamW)
    assert not isinstance(Trainer.build_optimizer(solver_cfg(), model), torch.optim.AdamW)


def run_three_steps(model_params, optimizer):
    """Three steps of ``optimizer`` on a fixed batch, through ``tiny_model``'s layers."""
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        optimizer.zero_grad()
        out = nn.functional.conv2d(x, model_params[0], model_params[1])
        out = nn.functional.group_norm(out, 2, model_params[2], model_params[3])
        out = nn.functional.conv2d(out, model_params[4], model_params[5])
        out.square().mean().backward()
        optimizer.step()


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_steps_like_detectrons_sgd_with_the_fused_kernel(nesterov):
    from detectron2.solver import build_optimizer as detectrons_build_optimizer

    cfg = solver_cfg("SOLVER.BASE_LR", 0.1, "SOLVER.NESTEROV", nesterov,
                     "SOLVER.WEIGHT_DECAY", 0.01)
    torch.manual_seed(0)
    model, reference = tiny_model(), tiny_model()
    reference.load_state_dict(model.state_dict())
    before = [p.detach().clone() for p in model.parameters()]
    ours, theirs = build_optimizer(cfg, model), detectrons_build_optimizer(cfg, reference)
    assert ours.defaults["fused"] is True and not theirs.defaults.get("fused")
    run_three_steps(list(model.parameters()), ours)
    run_three_steps(list(reference.parameters()), theirs)
    for mine, expected, start in zip(model.parameters(), reference.parameters(), before):
        assert (mine - start).abs().max() > 1e-4  # the steps moved it
        torch.testing.assert_close(mine, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["SGD", "ADAMW"])
def test_gradient_clipping_keeps_the_loop_kernel_and_clips(name):
    cfg = solver_cfg("SOLVER.OPTIMIZER", name, "SOLVER.CLIP_GRADIENTS.ENABLED", True,
                     "SOLVER.CLIP_GRADIENTS.CLIP_TYPE", "value",
                     "SOLVER.CLIP_GRADIENTS.CLIP_VALUE", 1e-3)
    model = tiny_model()
    optimizer = build_optimizer(cfg, model)
    assert not optimizer.defaults["fused"]
    for p in model.parameters():
        p.grad = torch.full_like(p, 5.0)
    optimizer.step()
    assert all(p.grad.abs().max() <= 1e-3 for p in model.parameters())  # clipped in step


def test_a_checkpoint_of_the_loop_kernel_resumes_on_the_fused_one_under_a_grad_scaler():
    from detectron2.solver import build_optimizer as detectrons_build_optimizer

    cfg = solver_cfg()
    model = tiny_model()
    old = detectrons_build_optimizer(cfg, model)  # saved before the fused kernel
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    old.step()
    ours = build_optimizer(cfg, model)
    ours.load_state_dict(old.state_dict())
    assert all(group["fused"] is True for group in ours.param_groups)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    before = [p.detach().clone() for p in model.parameters()]
    ours.zero_grad()
    scaler.scale(sum(p.sum() for p in model.parameters())).backward()
    scaler.step(ours)  # the fused step undoes the scale itself
    scaler.update()
    assert all(not torch.equal(p, b) for p, b in zip(model.parameters(), before))


def deformable_model():
    from fcos_d2.modeling.layers import DeformConv2d

    return nn.Sequential(DeformConv2d(4, 4, norm=nn.GroupNorm(2, 4)), nn.Conv2d(4, 2, 1))


@pytest.mark.parametrize("optimizer_name", ["SGD", "ADAMW"])
def test_offset_lr_factor_scales_only_the_offset_predictors(optimizer_name):
    model = deformable_model()
    optimizer = build_optimizer(solver_cfg("SOLVER.OPTIMIZER", optimizer_name,
                                           "SOLVER.DEFORM_OFFSET_LR_FACTOR", 0.1), model)
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    assert len(groups) == len(list(model.parameters()))  # each parameter once
    deform, conv = model[0], model[1]
    assert groups[id(deform.offset.weight)]["lr"] == pytest.approx(0.0001)
    assert groups[id(deform.offset.weight)]["weight_decay"] == 0.05
    assert groups[id(deform.offset.bias)]["lr"] == pytest.approx(0.0002)  # x BIAS_LR_FACTOR
    assert groups[id(deform.offset.bias)]["weight_decay"] == 0.0
    assert groups[id(deform.weight)]["lr"] == 0.001
    assert groups[id(conv.weight)]["lr"] == 0.001


def test_offset_lr_factor_one_leaves_detectrons_groups():
    model = deformable_model()
    default = build_optimizer(solver_cfg(), model)
    assert solver_cfg().SOLVER.DEFORM_OFFSET_LR_FACTOR == 1.0
    plain = {id(p): g["lr"] for g in default.param_groups for p in g["params"]}
    assert plain[id(model[0].offset.weight)] == plain[id(model[0].weight)] == 0.001


def test_offset_lr_factor_survives_the_lr_schedule():
    from detectron2.solver import build_lr_scheduler

    model = deformable_model()
    cfg = solver_cfg("SOLVER.OPTIMIZER", "ADAMW", "SOLVER.DEFORM_OFFSET_LR_FACTOR", 0.1,
                     "SOLVER.WARMUP_ITERS", 0, "SOLVER.MAX_ITER", 10, "SOLVER.STEPS", (5,))
    optimizer = build_optimizer(cfg, model)
    scheduler = build_lr_scheduler(cfg, optimizer)
    for _ in range(6):
        optimizer.step()
        scheduler.step()
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    assert groups[id(model[0].offset.weight)]["lr"] == pytest.approx(0.0001 * cfg.SOLVER.GAMMA)
    assert groups[id(model[0].weight)]["lr"] == pytest.approx(0.001 * cfg.SOLVER.GAMMA)


def test_negative_offset_lr_factor_is_named():
    with pytest.raises(ValueError, match="SOLVER.DEFORM_OFFSET_LR_FACTOR"):
        build_optimizer(solver_cfg("SOLVER.DEFORM_OFFSET_LR_FACTOR", -0.1), deformable_model())


def test_adamw_on_full_lr_offsets_warns_naming_the_key(caplog):
    with caplog.at_level("WARNING", logger="fcos_d2.engine.optimizer"):
        build_optimizer(solver_cfg("SOLVER.OPTIMIZER", "ADAMW"), deformable_model())
        build_optimizer(solver_cfg("SOLVER.OPTIMIZER", "ADAMW"), tiny_model())  # no DCN
        build_optimizer(solver_cfg("SOLVER.OPTIMIZER", "ADAMW",
                                   "SOLVER.DEFORM_OFFSET_LR_FACTOR", 0.1), deformable_model())
        build_optimizer(solver_cfg(), deformable_model())  # SGD's updates scale with grads
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "SOLVER.DEFORM_OFFSET_LR_FACTOR 1.0" in warnings[0]
