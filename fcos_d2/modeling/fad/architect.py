"""The two steps of FAD's bilevel (DARTS) search, on the current network.

Symbols: w the weights, a the architecture weights, L_trn and L_val the detection loss on
a batch of the training split and of the architecture split, xi the weights' learning rate
(per weight: its parameter group's).

* :func:`weight_step`: SGD on w with L_trn (the architecture weights' gradients dropped);
* :func:`architecture_step`: Adam on a with dL_val/da (first order), or with the unrolled
  gradient dL_val(w', a)/da - d2 L_trn(w, a)/(da dw) . (xi * dL_val(w', a)/dw') at
  w' = w - xi * (momentum + dL_trn/dw + weight decay * w) (second order), whose
  Hessian-vector product is the central difference of :func:`finite_difference_hvp`.

Every extra forward of the architecture step runs on the current weights and buffers and
leaves both as they were (BatchNorm statistics do not learn from the architecture split);
the architecture step changes the architecture weights only.
"""
from contextlib import contextmanager
from typing import Callable, Iterator, List, Optional, Sequence

import torch
from torch import Tensor, nn

LossFn = Callable[[], Tensor]  # the summed loss of one fixed batch, recomputed per call
Reduce = Callable[[List[Tensor]], None]  # averages gradients over the workers, in place


def _no_reduce(grads: List[Tensor]) -> None:
    """One worker: nothing to average."""


@contextmanager
def kept_state(model: nn.Module, weights: Sequence[Tensor]) -> Iterator[None]:
    """Restores ``weights`` and every buffer of ``model`` on exit."""
    saved = [w.detach().clone() for w in weights]
    buffers = [b.detach().clone() for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for w, s in zip(weights, saved):
                w.copy_(s)
            for b, s in zip(model.buffers(), buffers):
                b.copy_(s)


def _grads(loss: Tensor, params: Sequence[Tensor]) -> List[Tensor]:
    grads = torch.autograd.grad(loss, list(params), allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def finite_difference_hvp(loss_fn: LossFn, weights: Sequence[Tensor], alphas: Sequence[Tensor],
                          vector: Sequence[Tensor], eps_scale: float = 0.01) -> List[Tensor]:
    """(dL(w + eps v)/da - dL(w - eps v)/da) / (2 eps), eps = eps_scale / ||v||: the
    product of the mixed second derivative d2 L/(da dw) with ``vector`` v, to O(eps^2).
    ``weights`` are moved in place and restored (exactly: copies, not a subtraction)."""
    norm = torch.cat([v.flatten() for v in vector]).norm()
    eps = eps_scale / norm.clamp(min=1e-12)
    saved = [w.detach().clone() for w in weights]
    grads = []
    for sign in (1.0, -1.0):
        with torch.no_grad():
            for w, s, v in zip(weights, saved, vector):
                w.copy_(s + sign * eps * v)
        grads.append(_grads(loss_fn(), alphas))
    with torch.no_grad():
        for w, s in zip(weights, saved):
            w.copy_(s)
    return [(plus - minus) / (2 * eps) for plus, minus in zip(*grads)]


def step_sizes(weights: Sequence[Tensor], optimizer: torch.optim.Optimizer,
               lr: Optional[float]) -> List[float]:
    """Each weight's step size xi: ``lr`` for all, or (None) its group's current lr in
    ``optimizer`` (FAD's groups: biases at twice the lr)."""
    if lr is not None:
        return [lr] * len(weights)
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    return [groups[id(w)]["lr"] for w in weights]


def virtual_step(weights: Sequence[Tensor], grads: Sequence[Tensor],
                 optimizer: torch.optim.Optimizer, lr: Optional[float]) -> None:
    """w <- w - xi * (momentum * buffer + g + weight decay * w), one step of the SGD
    ``optimizer`` (its momentum and weight decay per group; xi per ``step_sizes``) without
    touching its state."""
    settings = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    with torch.no_grad():
        for w, g, xi in zip(weights, grads, step_sizes(weights, optimizer, lr)):
            group = settings[id(w)]
            buffer = optimizer.state.get(w, {}).get("momentum_buffer")
            step = g + group.get("weight_decay", 0.0) * w
            if buffer is not None:
                step = step + group.get("momentum", 0.0) * buffer
            w.sub_(xi * step)


def unrolled_alpha_grads(model: nn.Module, weights: Sequence[Tensor], alphas: Sequence[Tensor],
                         train_loss: LossFn, val_loss: LossFn,
                         optimizer: torch.optim.Optimizer, lr: Optional[float],
                         reduce: Reduce = _no_reduce) -> List[Tensor]:
    """Second-order DARTS: dL_val(w', a)/da - HVP(xi * dL_val/dw'), all on the current
    network, xi each weight's step size (``step_sizes``: ``lr``, or its group's lr).

    With several workers, ``reduce`` averages the weights' gradient of the virtual step and
    dL_val/dw' before they are used, so that every worker steps to the same w' and
    multiplies the Hessian by the same vector: the HVP is then linear in each worker's
    loss, and averaging the result (the caller's ``reduce``) gives the whole batch's."""
    with kept_state(model, weights):
        train_grads = _grads(train_loss(), weights)
        reduce(train_grads)
        virtual_step(weights, train_grads, optimizer, lr)  # w -> w'
        grads = _grads(val_loss(), [*alphas, *weights])
    dalpha, dw = grads[:len(alphas)], grads[len(alphas):]
    reduce(dw)
    scaled = [xi * d for xi, d in zip(step_sizes(weights, optimizer, lr), dw)]
    with kept_state(model, weights):
        hvp = finite_difference_hvp(train_loss, weights, alphas, scaled)
    return [da - h for da, h in zip(dalpha, hvp)]


def architecture_step(model: nn.Module, weights: Sequence[Tensor], alphas: Sequence[Tensor],
                      arch_optimizer: torch.optim.Optimizer, val_loss: LossFn, *,
                      second_order: bool = False, train_loss: LossFn = None,
                      weight_optimizer: torch.optim.Optimizer = None,
                      lr: Optional[float] = None,
                      reduce: Reduce = _no_reduce) -> None:
    """One Adam step of the architecture weights (first or second order; ``lr`` None: each
    weight's group lr in ``weight_optimizer``); ``reduce`` averages the gradients over
    workers in place. Weights and buffers stay as they were."""
    if second_order:
        grads = unrolled_alpha_grads(model, weights, alphas, train_loss, val_loss,
                                     weight_optimizer, lr, reduce)
    else:
        with kept_state(model, []):
            grads = _grads(val_loss(), alphas)
    reduce(grads)
    for a, g in zip(alphas, grads):
        a.grad = g
    arch_optimizer.step()
    arch_optimizer.zero_grad(set_to_none=True)


def weight_step(weights: Sequence[Tensor], alphas: Sequence[Tensor],
                optimizer: torch.optim.Optimizer, train_loss: LossFn, clip_norm: float = 0.0,
                reduce: Reduce = _no_reduce) -> Tensor:
    """One step of the weights' optimizer on L_trn (gradient norm clipped at ``clip_norm``
    when > 0); the architecture weights get no gradient and no update. Returns the loss."""
    loss = train_loss()
    grads = _grads(loss, weights)
    reduce(grads)
    for w, g in zip(weights, grads):
        w.grad = g
    if clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(weights, clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for a in alphas:
        a.grad = None
    return loss.detach()
