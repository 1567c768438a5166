"""Data-parallel training computes what one process computes on the whole batch; and
spawned CPU workers form one gloo group whose models DefaultTrainer's wrapping makes DDP.

Two CPU workers (fcos_d2.engine.launch, gloo) with one image each, their gradients averaged by
DistributedDataParallel as DefaultTrainer does, must give the gradients of one process
with both images. The images have different numbers of objects, so this holds only if the
loss normalizers (number of positives, sum of centerness targets) are reduced across the
workers. The head uses GroupNorm and the backbone FrozenBN, so no statistics depend on
how the batch is split.
"""
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.engine import defaults
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances
from detectron2.utils import comm

from fcos_d2 import add_fcos_config
from fcos_d2.engine.launch import launch
from test_launch import expected_reports, worker_report

REPO = Path(__file__).resolve().parents[2]
# Per image: (x0, y0, x1, y1, class) of each object. 2 objects, then 1: unequal positives.
OBJECTS = [[(10, 12, 60, 70, 0), (70, 20, 120, 50, 2)], [(30, 30, 100, 110, 1)]]


def tiny_fcos():
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "Base-FCOS.yaml"))
    cfg.merge_from_list([
        "MODEL.WEIGHTS", "", "MODEL.DEVICE", "cpu", "MODEL.RESNETS.DEPTH", "18",
        "MODEL.RESNETS.RES2_OUT_CHANNELS", "64", "MODEL.RESNETS.NORM", "FrozenBN",
        "MODEL.BACKBONE.FREEZE_AT", "0", "MODEL.FPN.OUT_CHANNELS", "64",
        "MODEL.FCOS.NORM", "GN", "MODEL.FCOS.NUM_CONVS", "2", "MODEL.FCOS.NUM_CLASSES", "3",
        "MODEL.FCOS.SIZES_OF_INTEREST", "[16, 32, 64, 128]"])
    return build_model(cfg).train()


def make_inputs():
    """Two 128x128 images (random pixels, same size: no padding differs) with OBJECTS."""
    generator = torch.Generator().manual_seed(0)
    inputs = []
    for objects in OBJECTS:
        image = torch.randint(0, 256, (3, 128, 128), generator=generator, dtype=torch.uint8)
        boxes = torch.tensor([o[:4] for o in objects], dtype=torch.float32)  # (M, 4)
        instances = Instances((128, 128), gt_boxes=Boxes(boxes),
                              gt_classes=torch.tensor([o[4] for o in objects]))
        inputs.append({"image": image, "instances": instances})
    return inputs


def losses_and_gradients(model, inputs):
    losses = model(inputs)
    sum(losses.values()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return {k: v.item() for k, v in losses.items()}, grads


def one_image_per_worker(folder: str) -> None:
    """Worker body: its own image, DDP-averaged gradients; rank 0 saves what it got."""
    model = tiny_fcos()
    model.load_state_dict(torch.load(Path(folder) / "initial.pth"))
    ddp = defaults.create_ddp_model(model, broadcast_buffers=False)  # as DefaultTrainer
    rank = comm.get_rank()
    losses = ddp(make_inputs()[rank:rank + 1])
    sum(losses.values()).backward()
    worker_losses = comm.all_gather({k: v.item() for k, v in losses.items()})
    seen = comm.all_gather(worker_report(ddp))
    if rank == 0:
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        torch.save({"losses": worker_losses, "grads": grads, "seen": seen},
                   Path(folder) / "workers.pth")


def test_two_workers_with_one_image_each_match_one_process_with_both(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CPU workers are spawned only where CUDA is not available")
    torch.manual_seed(0)
    model = tiny_fcos()
    torch.save(model.state_dict(), tmp_path / "initial.pth")
    expected_losses, expected_grads = losses_and_gradients(model, make_inputs())

    launch(one_image_per_worker, 2, dist_url="auto", args=(str(tmp_path),))
    got = torch.load(tmp_path / "workers.pth")
    assert got["seen"] == expected_reports(2)  # one gloo group; DDP-wrapped on the CPU

    # Each worker's loss is its image's share over the job's average normalizer.
    for key, expected in expected_losses.items():
        mean = sum(w[key] for w in got["losses"]) / 2
        assert abs(mean - expected) <= 1e-5 * abs(expected), (key, mean, expected)
    assert got["grads"].keys() == expected_grads.keys()
    assert len(expected_grads) == len(list(model.parameters()))  # every parameter has one
    whole = torch.cat([g.flatten() for g in expected_grads.values()]).norm()
    for name, expected in expected_grads.items():
        # A gradient under 1/1000 of the whole is float noise, so it is compared at that
        # scale: P7's is ~1e-8 of it (GroupNorm of a 1x1 map leaves 2 values per group, ±1).
        error = (got["grads"][name] - expected).norm()
        assert error <= 1e-5 * max(expected.norm(), 1e-3 * whole), (name, error, expected.norm())
