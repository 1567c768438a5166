"""The compile row of ``python -m benchmarks.speed``: ``torch.compile`` (inductor; a C++ compiler on
the CPU) of fcos-d2's backbone and head, against eager, for inference (the fast path as
configured: folded BN, channels_last) and for a training step, interleaved; with the
compile time (the first call) and the largest difference of the outputs.

Pre- and post-processing (ImageList, assignment, NMS) stay eager: they hold
data-dependent shapes, and the dense part is nearly all of the time.
"""
import time
from typing import Callable, Dict, List

import torch

from fcos_d2.engine.compile import compile_in_place, compiler_missing

TARGET = 1.15  # eager time over compiled time, for a key to be worth shipping


def _compiled_copy(contender, build: Callable, device: str):
    """A second contender of the same weights whose backbone and head are compiled in place,
    as MODEL.FCOS.COMPILE does in training."""
    twin = build()
    twin.model.load_state_dict(contender.model.state_dict())
    twin.model.train(contender.model.training)
    compile_in_place(twin.model, device)
    return twin


def _training_differences(eager, compiled, images, targets) -> Dict[str, float]:
    """Largest relative differences of the loss and of the gradients of one forward and
    backward pass (same weights, same batch), compiled against eager; the gradients are
    zeroed after."""
    results = []
    for contender in (eager, compiled):
        contender.model.zero_grad()
        loss = contender.loss(images, targets)
        loss.backward()
        grads = [p.grad.detach().clone() for p in contender.model.parameters()
                 if p.grad is not None]
        results.append((loss.item(), grads))
        contender.model.zero_grad()
    (loss_e, grads_e), (loss_c, grads_c) = results
    largest = max(float(g.abs().max()) for g in grads_e)
    return {"training_loss_rel_diff": abs(loss_c - loss_e) / max(abs(loss_e), 1e-12),
            "training_grad_max_abs_diff_over_largest":
                max(float((c - e).abs().max()) for c, e in zip(grads_c, grads_e)) / largest}


def _first_call_seconds(fn: Callable) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _largest_difference(a, b) -> float:
    a, b = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b)
               if isinstance(x, torch.Tensor))


def measure(device: str, image_size, repeats: int, interleaved, training_step) -> Dict:
    """Eager vs compiled seconds (medians), compile seconds and output differences, for
    inference (batch 1) and a training step (batch 2, 20 boxes per image)."""
    from benchmarks.speed import contenders as bc
    from fcos_d2.modeling.fast_inference import inference_model

    result = {}
    torch.manual_seed(0)
    build = lambda: bc.fcos_d2_contender(device)  # noqa: E731
    eager = build()
    eager.model.eval()
    fast = bc._detectron2_style("fcos-d2", inference_model(eager.model))
    fast_compiled = bc._detectron2_style("fcos-d2", inference_model(eager.model))
    fast_compiled.model.backbone = torch.compile(fast_compiled.model.backbone)
    fast_compiled.model.head = torch.compile(fast_compiled.model.head)
    images = bc.random_images(1, *image_size, device)
    with torch.no_grad():
        result["inference_compile_s"] = _first_call_seconds(
            lambda: fast_compiled.backbone_head(images))
        result["inference_max_abs_diff"] = _largest_difference(
            fast.backbone_head(images), fast_compiled.backbone_head(images))
        medians = interleaved({"eager": lambda: fast.infer(images),
                               "compiled": lambda: fast_compiled.infer(images)}, repeats, device)
    result["inference_eager_s"], result["inference_compiled_s"] = \
        medians["eager"], medians["compiled"]
    train_eager = build()
    train_compiled = _compiled_copy(train_eager, build, device)
    images = bc.random_images(2, *image_size, device)
    targets = bc.random_targets(2, 20, *image_size, device)
    start = time.perf_counter()  # the first compiled pass compiles
    result.update(_training_differences(train_eager, train_compiled, images, targets))
    result["training_compile_s"] = time.perf_counter() - start
    steps = {"eager": training_step(train_eager, device, False),
             "compiled": training_step(train_compiled, device, False)}
    medians = interleaved({name: (lambda s=s: s(images, targets)) for name, s in steps.items()},
                          repeats, device)
    result["training_eager_s"], result["training_compiled_s"] = \
        medians["eager"], medians["compiled"]
    return result


def row(args, interleaved, training_step, image_size) -> List[dict]:
    print(f"\n[compile: torch.compile (inductor) of backbone + head, "
          f"{'x'.join(map(str, image_size))}]")
    missing = compiler_missing(args.device)
    if missing:
        print(f"  skipped: {missing}")
        return [{"row": "compile", "skipped": missing}]
    result = measure(args.device, image_size, args.repeats, interleaved, training_step)
    targets = {}
    for mode in ("inference", "training"):
        speedup = result[f"{mode}_eager_s"] / result[f"{mode}_compiled_s"]
        result[f"{mode}_speedup"] = speedup
        targets[f"{mode} eager / compiled (ship a key if >= {TARGET})"] = speedup
        print(f"  {mode:9s} eager {result[f'{mode}_eager_s']:.3f} s, compiled "
              f"{result[f'{mode}_compiled_s']:.3f} s: {speedup:.2f}x; compile (first call) "
              f"{result[f'{mode}_compile_s']:.0f} s")
    print(f"  inference outputs, largest |compiled - eager|: "
          f"{result['inference_max_abs_diff']:.1e}; training: loss relative difference "
          f"{result['training_loss_rel_diff']:.1e}, gradients' largest difference "
          f"{result['training_grad_max_abs_diff_over_largest']:.1e} of the largest gradient")
    return [{"row": "compile", **result, "targets": targets}]
