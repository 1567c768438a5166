"""SipMask through train_net.py: a short training on images with masks lowers the mask
loss, and a run resumed from a checkpoint ends with the weights of the uninterrupted run.

The model is configs/quickstart-sipmask.yaml made tiny (FPN width 32, 8 basis masks),
trained from a fixed seed on 4 synthetic 128x128 images with RLE masks, registered with
--register-coco, 2 a batch, with random flips, on the CPU. Trainings are forks of one
server process (tests/training_processes.py).
"""
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import BitMasks, Boxes, Instances
from detectron2.utils.events import EventStorage

from fcos_d2 import add_fcos_config
from fcos_d2.data import synthetic
from fcos_d2.modeling.assignment import compute_locations
from fcos_d2.modeling.meta_arch import flatten_levels
from fcos_d2.modeling.sipmask.loss import sipmask_mask_loss
from training_processes import REPO

# 30 iterations; checkpoints after iterations 9, 19 and 29 (model_final).
TINY = ["MODEL.DEVICE", "cpu", "MODEL.FPN.OUT_CHANNELS", "32", "MODEL.SIPMASK.NUM_BASIS", "8",
        "MODEL.SIPMASK.BASIS_HIDDEN_CHANNELS", "32", "SEED", "7", "SOLVER.IMS_PER_BATCH", "2",
        "SOLVER.WARMUP_ITERS", "2", "SOLVER.MAX_ITER", "30", "SOLVER.STEPS", "(100,)",
        "SOLVER.CHECKPOINT_PERIOD", "10", "DATALOADER.NUM_WORKERS", "0",
        "DATASETS.TRAIN", "('tiny_masks',)", "DATASETS.TEST", "('tiny_masks',)"]


@pytest.fixture(scope="module")
def mask_dataset(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_masks")
    synthetic.write_split(folder, split="val", num_images=4, masks=True)
    return folder


@pytest.fixture(scope="module")
def runs(mask_dataset, tmp_path_factory, scripts):
    """An uninterrupted run, and a run that resumes from its checkpoint of iteration 19."""
    root = tmp_path_factory.mktemp("sipmask_runs")
    argv = lambda out, *flags: [
        "--config-file", "configs/quickstart-sipmask.yaml", "--register-coco", "tiny_masks",
        str(mask_dataset / "annotations.json"), str(mask_dataset / "images"), "--skip-test",
        *flags, *TINY, "OUTPUT_DIR", str(out)]
    server = scripts
    try:
        whole, resumed = root / "whole", root / "resumed"
        status, _ = server.wait(server.start(argv(whole), log=root / "whole.log"))
        assert status == 0, (root / "whole.log").read_text()[-5000:]
        resumed.mkdir()
        shutil.copy(whole / "model_0000019.pth", resumed)
        (resumed / "last_checkpoint").write_text("model_0000019.pth")
        status, _ = server.wait(server.start(argv(resumed, "--resume"), log=root / "resumed.log"))
        assert status == 0, (root / "resumed.log").read_text()[-5000:]
    finally:
        server.stop_running()
    return {"whole": whole, "resumed": resumed, "log": (root / "resumed.log").read_text()}


def training_images():
    """The 4 images as training inputs: (3, 128, 128) BGR, gt boxes, classes and masks."""
    inputs = []
    for index in range(4):
        pixels, objects = synthetic.render_image(seed=synthetic.SPLIT_SEEDS["val"], index=index)
        instances = Instances(pixels.shape[:2])
        xywh = torch.tensor([synthetic.tight_box(o.visible_mask) for o in objects],
                            dtype=torch.float32).reshape(-1, 4)
        instances.gt_boxes = Boxes(torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1))
        instances.gt_classes = torch.tensor([o.class_index for o in objects], dtype=torch.int64)
        masks = np.array([o.visible_mask for o in objects], dtype=bool)
        instances.gt_masks = BitMasks(torch.from_numpy(masks).reshape(-1, *pixels.shape[:2]))
        image = torch.from_numpy(pixels[:, :, ::-1].copy()).permute(2, 0, 1)
        inputs.append({"image": image, "instances": instances})
    return inputs


def mask_loss_on_true_boxes(checkpoint: Path) -> float:
    """SipMask's mask loss of a checkpoint on the 4 images, with every positive's box the
    ground-truth box it is assigned to and weight 1: unlike the training loss, which crops
    to the predicted boxes and weights by their scores and IoUs, a fixed objective (the
    training loss moves as the boxes learn: on an AMD EPYC it went 0.38, 0.67, 0.50 over
    iterations 9, 19, 29)."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart-sipmask.yaml"))
    cfg.merge_from_list(TINY)
    model = build_model(cfg)
    model.load_state_dict(torch.load(checkpoint, weights_only=True)["model"])
    model.train()
    inputs = training_images()
    instances = [x["instances"] for x in inputs]
    with EventStorage(), torch.no_grad():
        logits, _, _, coefficients, basis = model.forward_head(model.preprocess_image(inputs))
        locations = compute_locations([x.shape[-2:] for x in logits], model.strides, "cpu")
        labels, _, matched = model.targets(locations, instances)  # (N, R) each
        true_boxes = torch.stack([x.gt_boxes.tensor[m.clamp(0, len(x) - 1)]
                                  for x, m in zip(instances, matched)])  # (N, R, 4)
        # Equal class logits: every weight (score x IoU 1, scaled to mean 1) is 1.
        return sipmask_mask_loss(
            basis=basis, coefficients=flatten_levels(coefficients), pred_boxes=true_boxes,
            logits=torch.zeros(*labels.shape, model.num_classes), labels=labels,
            matched=matched, instances=instances, num_classes=model.num_classes).item()


def test_training_through_train_net_lowers_the_mask_loss(runs):
    early = mask_loss_on_true_boxes(runs["whole"] / "model_0000009.pth")
    final = mask_loss_on_true_boxes(runs["whole"] / "model_final.pth")
    # Between iterations 9 and 29 (AMD EPYC with AVX512-BF16, no AMX, one thread: 0.688 ->
    # 0.370 with the config as it is; 0.679 -> 0.452 with SipMask's stride-8 basis, the
    # focal loss and ReLU distances).
    assert early > 0
    assert final < 0.9 * early, (early, final)


def test_a_resumed_run_ends_with_the_weights_of_the_uninterrupted_run(runs):
    assert "Starting training from iteration 20" in runs["log"]
    whole = torch.load(runs["whole"] / "model_final.pth", weights_only=True)["model"]
    resumed = torch.load(runs["resumed"] / "model_final.pth", weights_only=True)["model"]
    assert whole.keys() == resumed.keys()
    difference = max((whole[k].double() - resumed[k].double()).abs().max().item() for k in whole)
    assert difference <= 1e-6, difference
