"""The hot path of fcos-d2's training step and inference asks the device for no values:
none of the operations that wait for the device (``.item()``, ``.nonzero()``,
``bool(tensor)``, ``float(tensor)``, ``int(tensor)``, ``.cpu()``, ``.tolist()``, and
reading or assigning through a boolean mask, a hidden nonzero) is called in the model's
forward + losses, or in an inference call, but the exceptions listed in ALLOWED with the
reason for each.

On the CPU nothing waits, so the test counts the calls instead: a TorchFunctionMode sees
each of those operations and records the file and function of its caller.
(On a GPU the same holds with ``torch.cuda.set_sync_debug_mode("error")``; no GPU is lent
to this test.)
"""
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances
from detectron2.utils.events import EventStorage
from torch.overrides import TorchFunctionMode

from fcos_d2 import add_fcos_config

REPO = Path(__file__).resolve().parents[2]
SYNCING = ("item", "nonzero", "__bool__", "__float__", "__int__", "cpu", "tolist")

MASK_INDEX = "boolean mask index"

# (file, function, operation) -> why it may sync.
ALLOWED = {
    # How many locations are positive is data, and it sizes the box and centerness losses:
    # one nonzero per step gives their rows (it replaced three boolean-mask selections and
    # the focal loss's own nonzero; the weight sum's .item() and the IoU loss's branch on a
    # sum are gone).
    ("fcos_d2/modeling/losses.py", "positive_rows", "nonzero"): "training: the positives",
    # Which (location, class) pairs pass the score threshold is data: one nonzero for the
    # whole batch selects them, and their counts per image and level, read once, split
    # them for the per-level top-k (before: a boolean mask and a nonzero per level and
    # image, 2 x 5 x N syncs).
    ("fcos_d2/modeling/postprocess.py", "select_candidates_batched", "nonzero"):
    "inference: the candidates above the score threshold",
    ("fcos_d2/modeling/postprocess.py", "select_candidates_batched", "tolist"):
    "inference: how many candidates each image and level has",
    # detectron2's Boxes.clip asserts that every box is finite (bool of a tensor): kept, a
    # NaN box must stop inference with detectron2's message rather than pass NMS.
    ("detectron2/structures/boxes.py", "clip", "__bool__"): "inference: detectron2 checks "
    "that the boxes are finite before clipping",
    # detectron2's detector_postprocess drops the boxes left empty after rescaling (a
    # boolean mask through Instances and Boxes): its public function, kept as it is.
    ("detectron2/structures/instances.py", "__getitem__", MASK_INDEX): "inference: "
    "detector_postprocess drops empty boxes",
    ("detectron2/structures/boxes.py", "__getitem__", MASK_INDEX): "inference: the same",
}


def _tiny_model(**fcos):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "FCOS-R50.yaml"))
    cfg.MODEL.DEVICE, cfg.MODEL.WEIGHTS = "cpu", ""
    cfg.MODEL.RESNETS.DEPTH, cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 18, 64
    cfg.MODEL.FPN.OUT_CHANNELS, cfg.MODEL.FCOS.NUM_CONVS, cfg.MODEL.FCOS.NUM_CLASSES = 32, 1, 3
    cfg.MODEL.FCOS.INFERENCE_TH_TEST = 0.0  # every location a candidate: the paths all run
    for key, value in fcos.items():
        setattr(cfg.MODEL.FCOS, key, value)
    torch.manual_seed(0)
    return build_model(cfg)


def _inputs():
    """Two 64x96 images: one with two boxes, one without any."""
    inputs = []
    for boxes in ([[4.0, 6.0, 40.0, 50.0], [30.0, 10.0, 90.0, 60.0]], []):
        instances = Instances((64, 96))
        instances.gt_boxes = Boxes(torch.tensor(boxes).reshape(-1, 4))
        instances.gt_classes = torch.arange(len(boxes))
        inputs.append({"image": torch.rand(3, 64, 96) * 255, "instances": instances})
    return inputs


# Frames of torch's own dispatch between a caller and the mode, skipped when naming the caller.
_DISPATCH_FILES = ("torch/overrides.py", "torch/_tensor.py", "tests/modeling/test_host_syncs.py")


def _caller():
    """(file relative to its package root, function) of the code that called the operation:
    the first frame outside this mode and torch's dispatch wrappers."""
    frame = sys._getframe(1)
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve().as_posix()
        for root in ("fcos_d2/", "detectron2/", "torchvision/", "torch/", "benchmarks/",
                     "tests/"):
            if "/" + root in path:
                path = root + path.rsplit("/" + root, 1)[1]
                break
        if path not in _DISPATCH_FILES or frame.f_code.co_name.startswith("test_"):
            return path, frame.f_code.co_name
        frame = frame.f_back
    return "?", "?"


def _is_mask_index(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in parts)


class SyncCounter(TorchFunctionMode):
    """Counts every syncing operation that goes through torch's dispatch while it is
    active, by (caller file, caller function, operation). A TorchFunctionMode sees each
    call without touching torch.Tensor (patching its methods changes the type's slots for
    good: tensors then look like Python sequences to torch.tensor())."""

    def __init__(self):
        super().__init__()
        self.calls = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in SYNCING:
            self.calls[(*_caller(), name)] += 1
        elif name in ("__getitem__", "__setitem__") and len(args) > 1 \
                and _is_mask_index(args[1]):
            self.calls[(*_caller(), MASK_INDEX)] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def sync_calls():
    """A Counter of (file, function, operation) of every syncing call while it is active."""
    with SyncCounter() as counter:
        yield counter.calls


def _not_allowed(calls):
    return {call: n for call, n in calls.items() if call not in ALLOWED}


def test_the_patch_counts_each_syncing_operation(sync_calls):
    x = torch.tensor([0.0, 2.0])
    x.item() if x.numel() == 1 else x[1].item()
    bool(x[1]), float(x[0]), int(x[1]), x.nonzero(), x.cpu(), x.tolist(), x[x > 1]
    x[x > 1] = 0.0
    ours = Counter({op: n for (path, _, op), n in sync_calls.items()
                    if path == "tests/modeling/test_host_syncs.py"})
    assert torch.tensor([[x[0], x[1]]]).shape == (1, 2)  # tensors are no sequences
    assert set(ours) == {*SYNCING, MASK_INDEX} and ours[MASK_INDEX] == 2


@pytest.mark.parametrize("fcos", [{}, {"LOSS_NORMALIZER": "ema"}], ids=["default", "ema"])
def test_a_training_step_calls_no_syncing_operation(sync_calls, fcos):
    model = _tiny_model(**fcos).train()
    inputs = _inputs()
    with EventStorage(0):
        model(inputs)  # the first call may build caches
        sync_calls.clear()
        losses = model(inputs)
    assert sorted(losses) == ["loss_fcos_cls", "loss_fcos_ctr", "loss_fcos_loc"]
    assert _not_allowed(sync_calls) == {}
    assert sync_calls[("fcos_d2/modeling/losses.py", "positive_rows", "nonzero")] == 1


@pytest.mark.parametrize("fast", [True, False], ids=["folded copy", "as trained"])
def test_an_inference_call_syncs_only_where_allowed(sync_calls, fast):
    model = _tiny_model(FAST_INFERENCE=fast).eval()
    inputs = [{"image": x["image"]} for x in _inputs()]
    with torch.no_grad():
        model(inputs)  # the first call builds the folded copy
        sync_calls.clear()
        outputs = model(inputs)
    assert len(outputs) == 2 and len(outputs[0]["instances"]) > 0
    assert _not_allowed(sync_calls) == {}
    # one candidate selection and one read of the counts for the batch, and no more
    for operation in ("nonzero", "tolist"):
        assert sync_calls[("fcos_d2/modeling/postprocess.py", "select_candidates_batched",
                           operation)] == 1
