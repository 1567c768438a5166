"""The backends row of ``python -m benchmarks.speed``: R-50 FCOS (configs/FCOS-R50.yaml,
random weights seeded 0) at batch 1 through each ``MODEL.FCOS.INFERENCE_BACKEND`` (eager
fp32, bf16 compiled with frozen weights, int8 by PT2E, and "auto", the default, as a model
kept to serve: its choice in the record) beside torchvision's fp32 FCOS,
timed interleaved; with the seconds of each one's first calls (compiling, and calibrating
int8) and how many of fp32's 20 best detections it finds (same class, corners within 4
pixels; score threshold 0, as random weights score every class near the prior). The timed
calls run at the configured threshold (``INFERENCE_TH_TEST``, 0.05), as the inference row
and every user do: at 0 the post-processing would rank all 1.6 M candidates of an 800x1216
image, which torchvision's FCOS at its own threshold (0.2) does not. Random weights give no
AP: the AP of each backend is the ``backends-ap`` row's.
"""
import time
from typing import Dict, List

import torch
from detectron2.modeling import build_model

from benchmarks.speed import contenders as bc
from fcos_d2.modeling.backend_choice import choose_backend
from fcos_d2.modeling.inference_backends import INT8_CALIBRATION_BATCHES, torchao_available

TOP, BOX_TOL = 20, 4.0  # the agreement: fp32's best detections, corner tolerance in pixels


def _model(backend: str, state_dict: dict) -> torch.nn.Module:
    model = build_model(bc.fcos_d2_cfg("cpu", INFERENCE_BACKEND=backend, INFERENCE_TH_TEST=0.0))
    model.load_state_dict(state_dict)
    return model.eval()


def _found(got, want) -> int:
    """How many of ``want``'s ``TOP`` best detections ``got`` has (class, corners)."""
    boxes, classes = got.pred_boxes.tensor[: 2 * TOP], got.pred_classes[: 2 * TOP]
    found = 0
    for box, cls in zip(want.pred_boxes.tensor[:TOP], want.pred_classes[:TOP]):
        close = (boxes - box).abs().max(dim=1).values <= BOX_TOL
        found += bool((close & (classes == cls)).any())
    return found


def _warm(model, images, calls: int) -> float:
    """Seconds of the first ``calls`` calls (compilation, and calibration for int8)."""
    start = time.perf_counter()
    for _ in range(calls):
        model(bc._d2_inputs(images))
    return time.perf_counter() - start


def measure(image_size, repeats: int, interleaved, kind: str) -> List[dict]:
    torch.manual_seed(0)
    cfg = bc.fcos_d2_cfg("cpu")  # configs/FCOS-R50.yaml
    eager = _model("eager", build_model(cfg).state_dict())  # seeded weights
    state = eager.state_dict()
    timed_thresh = cfg.MODEL.FCOS.INFERENCE_TH_TEST
    models = {"fcos-d2 eager fp32": eager, f"fcos-d2 bf16_compiled ({kind})":
              _model("bf16_compiled", state)}
    if torchao_available():
        models["fcos-d2 int8_pt2e"] = _model("int8_pt2e", state)
    models["fcos-d2 auto"] = _model("auto", state)
    images = bc.random_images(1, *image_size, "cpu")
    torchvision = bc.torchvision_contender("cpu", image_size)
    torchvision.model.eval()
    extra = {}
    with torch.no_grad():
        want = eager(bc._d2_inputs(images))[0]["instances"]
        for name, model in models.items():
            calls = INT8_CALIBRATION_BATCHES + 1 if "int8" in name else 1
            first_calls = round(_warm(model, images, calls), 1)
            found = _found(model(bc._d2_inputs(images))[0]["instances"], want)
            extra[name] = {"first_calls_s": first_calls,
                           "found_of_top": f"{found}/{min(TOP, len(want))}"}
            model.score_thresh = timed_thresh
        fns = {"torchvision fp32": lambda: torchvision.infer(images)}
        fns.update({n: (lambda m=m: m(bc._d2_inputs(images))) for n, m in models.items()})
        medians = interleaved(fns, repeats, "cpu")
    extra["fcos-d2 auto"]["auto_choice"] = choose_backend(  # a model kept loaded, this size
        "auto", "cpu", pixels=image_size[0] * image_size[1]).reason
    return [{"row": "backends", "contender": name, "batch": 1, "seconds": seconds,
             "image_size": list(image_size), **extra.get(name, {})}
            for name, seconds in medians.items()]


def row(args, interleaved, image_size, kind: str) -> List[dict]:
    print(f"\n[backends: MODEL.FCOS.INFERENCE_BACKEND, R-50 FCOS, batch 1, "
          f"{'x'.join(map(str, image_size))}]")
    if args.device != "cpu":
        print("  skipped: the inference backends are CPU paths")
        return [{"row": "backends", "skipped": "the inference backends are CPU paths"}]
    results = measure(image_size, args.repeats, interleaved, kind)
    base = next(r["seconds"] for r in results if r["contender"] == "torchvision fp32")
    targets: Dict[str, float] = {}
    for r in results:
        print(f"  {r['contender']:34s} {r['seconds'] * 1e3:8.1f} ms  {r['seconds'] / base:.3f}x "
              f"torchvision fp32  first calls {r.get('first_calls_s', '-')} s  "
              f"found {r.get('found_of_top', '-')}")
        if r["contender"] != "torchvision fp32":
            size = "x".join(map(str, image_size))
            targets[f"{r['contender']} / torchvision fp32 at {size} (target <= 0.12 with "
                    "AMX)"] = r["seconds"] / base
    results[-1]["targets"] = targets
    return results
