"""NAS-FCOS through train_net.py: a short training of the quickstart config made tiny
lowers the loss, and a run resumed from a checkpoint ends with the weights of the
uninterrupted run.

configs/NAS-FCOS/quickstart.yaml at FPN width 32, trained from a fixed seed on 4 synthetic
128x128 images registered with --register-coco, 2 a batch, on the CPU; trainings are
forks of one server process (tests/training_processes.py).
"""
import shutil
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances
from detectron2.utils.events import EventStorage

from fcos_d2 import add_fcos_config
from fcos_d2.data import synthetic
from training_processes import REPO

CONFIG = "configs/NAS-FCOS/quickstart.yaml"
# 20 iterations; checkpoints after iterations 4, 9, 14 and 19 (model_final).
TINY = ["MODEL.DEVICE", "cpu", "MODEL.NAS_FCOS.CHANNELS", "32", "SEED", "7",
        "SOLVER.IMS_PER_BATCH", "2", "SOLVER.WARMUP_ITERS", "2", "SOLVER.MAX_ITER", "20",
        "SOLVER.STEPS", "(100,)", "SOLVER.CHECKPOINT_PERIOD", "5",
        "DATALOADER.NUM_WORKERS", "0", "DATASETS.TRAIN", "('tiny',)",
        "DATASETS.TEST", "('tiny',)"]


@pytest.fixture(scope="module")
def runs(dataset, tmp_path_factory, scripts):
    """An uninterrupted run, and a run that resumes from its checkpoint of iteration 9."""
    root = tmp_path_factory.mktemp("nas_fcos_runs")
    argv = lambda out, *flags: [
        "--config-file", CONFIG, "--register-coco", "tiny", str(dataset / "annotations.json"),
        str(dataset / "images"), "--skip-test", *flags, *TINY, "OUTPUT_DIR", str(out)]
    try:
        whole, resumed = root / "whole", root / "resumed"
        status, _ = scripts.wait(scripts.start(argv(whole), log=root / "whole.log"))
        assert status == 0, (root / "whole.log").read_text()[-5000:]
        resumed.mkdir()
        shutil.copy(whole / "model_0000009.pth", resumed)
        (resumed / "last_checkpoint").write_text("model_0000009.pth")
        status, _ = scripts.wait(scripts.start(argv(resumed, "--resume"),
                                               log=root / "resumed.log"))
        assert status == 0, (root / "resumed.log").read_text()[-5000:]
    finally:
        scripts.stop_running()
    return {"whole": whole, "resumed": resumed, "log": (root / "resumed.log").read_text()}


def training_images():
    """The 4 images of the dataset fixture (the first val images) as training inputs."""
    inputs = []
    for index in range(4):
        pixels, objects = synthetic.render_image(seed=synthetic.SPLIT_SEEDS["val"], index=index)
        instances = Instances(pixels.shape[:2])
        xywh = torch.tensor([synthetic.tight_box(o.visible_mask) for o in objects],
                            dtype=torch.float32).reshape(-1, 4)
        instances.gt_boxes = Boxes(torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1))
        instances.gt_classes = torch.tensor([o.class_index for o in objects], dtype=torch.int64)
        image = torch.from_numpy(pixels[:, :, ::-1].copy()).permute(2, 0, 1)
        inputs.append({"image": image, "instances": instances})
    return inputs


def total_loss(checkpoint: Path) -> float:
    """The sum of the three FCOS losses of a checkpoint on the 4 images, in float32."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / CONFIG))
    cfg.merge_from_list(TINY)
    model = build_model(cfg)
    model.load_state_dict(torch.load(checkpoint, weights_only=True)["model"])
    model.train()
    with EventStorage(), torch.no_grad():
        return sum(model(training_images()).values()).item()


def test_training_through_train_net_lowers_the_loss(runs):
    early = total_loss(runs["whole"] / "model_0000004.pth")
    final = total_loss(runs["whole"] / "model_final.pth")
    assert early > 0
    assert final < 0.9 * early, (early, final)


def test_a_resumed_run_ends_with_the_weights_of_the_uninterrupted_run(runs):
    assert "Starting training from iteration 10" in runs["log"]
    whole = torch.load(runs["whole"] / "model_final.pth", weights_only=True)["model"]
    resumed = torch.load(runs["resumed"] / "model_final.pth", weights_only=True)["model"]
    assert whole.keys() == resumed.keys()
    difference = max((whole[k].double() - resumed[k].double()).abs().max().item() for k in whole)
    assert difference <= 1e-6, difference
