"""The bilevel steps of FAD's search on a tiny model whose derivatives autograd gives
exactly: the second-order gradient, the Hessian-vector product, and which parameters
each step may change."""
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fcos_d2.modeling.fad.architect import (architecture_step, finite_difference_hvp,
                                            unrolled_alpha_grads, weight_step)


class Tiny(nn.Module):
    """loss = mean((sum_j softmax(a)_j tanh(x w^T)_j - y)^2), float64; the forward counts
    itself in a buffer, as BatchNorm's statistics change in a forward."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(3, 4, generator=generator, dtype=torch.float64))
        self.alpha = nn.Parameter(torch.randn(3, generator=generator, dtype=torch.float64))
        self.register_buffer("forwards", torch.zeros(1, dtype=torch.float64))

    def loss(self, x, y, w=None):
        self.forwards += 1
        h = torch.tanh(x @ (self.w if w is None else w).T)  # (B, 3)
        return ((h * F.softmax(self.alpha, 0)).sum(1) - y).pow(2).mean()


def _batches():
    generator = torch.Generator().manual_seed(1)
    make = lambda: (torch.randn(5, 4, generator=generator, dtype=torch.float64),
                    torch.randn(5, generator=generator, dtype=torch.float64))
    return make(), make()


def test_finite_difference_hvp_matches_autograd():
    model, ((x, y), _) = Tiny(), _batches()
    v = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    grad_w = torch.autograd.grad(model.loss(x, y), model.w, create_graph=True)[0]
    exact = torch.autograd.grad((grad_w * v).sum(), model.alpha)[0]
    w_before = model.w.detach().clone()
    estimate = finite_difference_hvp(lambda: model.loss(x, y), [model.w], [model.alpha], [v])[0]
    torch.testing.assert_close(estimate, exact, rtol=1e-4, atol=1e-8)
    assert torch.equal(model.w, w_before)  # restored exactly


def test_second_order_gradient_matches_autograd_through_the_unrolled_step():
    model, ((xt, yt), (xv, yv)) = Tiny(), _batches()
    lr, decay = 0.1, 0.05
    optimizer = torch.optim.SGD([model.w], lr=lr, momentum=0.9, weight_decay=decay)
    model.w.grad = torch.ones_like(model.w)
    optimizer.step()  # a momentum buffer b now exists
    model.w.grad = None
    buffer = optimizer.state[model.w]["momentum_buffer"].clone()
    # d/da L_val(w - lr (0.9 b + dL_trn/dw + decay w), a): the exact unrolled gradient
    grad_w = torch.autograd.grad(model.loss(xt, yt), model.w, create_graph=True)[0]
    w_unrolled = model.w - lr * (0.9 * buffer + grad_w + decay * model.w)
    exact = torch.autograd.grad(model.loss(xv, yv, w=w_unrolled), model.alpha)[0]
    w_before, forwards = model.w.detach().clone(), model.forwards.clone()
    estimate = unrolled_alpha_grads(model, [model.w], [model.alpha], lambda: model.loss(xt, yt),
                                    lambda: model.loss(xv, yv), optimizer, lr)[0]
    # the central difference's error is O(eps^2), eps = 0.01 / ||dL_val/dw'||
    torch.testing.assert_close(estimate, exact, rtol=1e-3, atol=1e-8)
    assert torch.equal(model.w, w_before)
    assert torch.equal(model.forwards, forwards)  # buffers as they were


@pytest.mark.parametrize("second_order", [False, True])
def test_architecture_step_changes_only_the_architecture_weights(second_order):
    model, ((xt, yt), (xv, yv)) = Tiny(), _batches()
    weights = torch.optim.SGD([model.w], lr=0.1, momentum=0.9)
    arch = torch.optim.Adam([model.alpha], lr=0.01, betas=(0.5, 0.999), weight_decay=1e-3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    architecture_step(model, [model.w], [model.alpha], arch, lambda: model.loss(xv, yv),
                      second_order=second_order, train_loss=lambda: model.loss(xt, yt),
                      weight_optimizer=weights, lr=0.1)
    after = model.state_dict()
    assert torch.equal(after["w"], before["w"]) and model.w.grad is None
    assert torch.equal(after["forwards"], before["forwards"])
    assert not torch.equal(after["alpha"], before["alpha"])


def test_first_order_architecture_gradient_is_the_current_networks():
    model, (_, (xv, yv)) = Tiny(), _batches()
    expected = torch.autograd.grad(model.loss(xv, yv), model.alpha)[0]
    seen = []
    architecture_step(model, [model.w], [model.alpha],
                      torch.optim.SGD([model.alpha], lr=0.0), lambda: model.loss(xv, yv),
                      reduce=lambda grads: seen.extend(g.clone() for g in grads))
    assert torch.equal(seen[0], expected)


def test_weight_step_changes_only_the_weights():
    model, ((xt, yt), _) = Tiny(), _batches()
    optimizer = torch.optim.SGD([model.w], lr=0.1)
    alpha, w = model.alpha.detach().clone(), model.w.detach().clone()
    weight_step([model.w], [model.alpha], optimizer, lambda: model.loss(xt, yt), clip_norm=5.0)
    assert torch.equal(model.alpha, alpha) and model.alpha.grad is None
    assert not torch.equal(model.w, w)


def test_second_order_gradient_steps_each_weight_at_its_groups_lr():
    """FAD's groups: the bias at 2x the lr. The unrolled step moves each weight by its own
    lr, and the gradient through it is autograd's exact one."""
    model, ((xt, yt), (xv, yv)) = Tiny(), _batches()
    model.b = nn.Parameter(torch.full((3,), 0.1, dtype=torch.float64))
    loss = lambda x, y, w=None, b=None: ((torch.tanh(x @ (model.w if w is None else w).T  # noqa: E731
                                                     + (model.b if b is None else b))
                                          * F.softmax(model.alpha, 0)).sum(1) - y).pow(2).mean()
    lr = 0.1
    optimizer = torch.optim.SGD([{"params": [model.w], "lr": lr},
                                 {"params": [model.b], "lr": 2 * lr, "weight_decay": 0.0}],
                                lr=lr, weight_decay=0.05)
    gw, gb = torch.autograd.grad(loss(xt, yt), [model.w, model.b], create_graph=True)
    w_unrolled = model.w - lr * (gw + 0.05 * model.w)
    b_unrolled = model.b - 2 * lr * gb
    exact = torch.autograd.grad(loss(xv, yv, w_unrolled, b_unrolled), model.alpha)[0]
    estimate = unrolled_alpha_grads(model, [model.w, model.b], [model.alpha],
                                    lambda: loss(xt, yt), lambda: loss(xv, yv), optimizer,
                                    None)[0]
    torch.testing.assert_close(estimate, exact, rtol=1e-3, atol=1e-8)
    one_lr = unrolled_alpha_grads(model, [model.w, model.b], [model.alpha],
                                  lambda: loss(xt, yt), lambda: loss(xv, yv), optimizer, lr)[0]
    assert not torch.allclose(one_lr, exact, rtol=1e-3, atol=1e-8)  # the groups matter
