"""train_net.py with weights that do not fit the model: --eval-only refuses them, listing
the tensors; a training starts from them with fresh layers where the shapes differ. And
the trainer saves its checkpoints through FCOSCheckpointer (atomic saves)."""
import logging
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.engine import hooks
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config
from fcos_d2.checkpoint import FCOSCheckpointer
from fcos_d2.data.register import register_coco_dataset
from test_train_net import TINY_MODEL, train_net

REPO = Path(__file__).resolve().parents[2]


def tiny_cfg(*opts: str):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs/quickstart.yaml"))
    cfg.merge_from_list([*TINY_MODEL, "MODEL.DEVICE", "cpu", *opts])
    return cfg


@pytest.fixture(scope="module")
def three_class_weights(tmp_path_factory) -> Path:
    """Weights of the tiny model with 3 classes (the dataset has 6)."""
    torch.manual_seed(0)
    model = build_model(tiny_cfg("MODEL.FCOS.NUM_CLASSES", "3"))
    path = tmp_path_factory.mktemp("weights") / "three_classes.pth"
    torch.save({"model": model.state_dict()}, path)
    return path


def test_eval_only_with_weights_of_another_class_count_fails_listing_the_shapes(
        scripts, dataset, three_class_weights, tmp_path):
    run = train_net(scripts, dataset, tmp_path, "MODEL.WEIGHTS", str(three_class_weights),
                    flags=["--eval-only"])
    assert run.returncode != 0
    assert f"WeightsMismatchError: weights {three_class_weights} do not fit" in run.stderr
    assert "head.cls_logits.weight: (3, 64, 3, 3) -> (6, 64, 3, 3)" in run.stderr
    assert "head.cls_logits.bias: (3,) -> (6,)" in run.stderr
    assert not (tmp_path / "inference").exists()  # nothing was evaluated


def test_the_trainer_saves_through_fcos_checkpointer_and_fine_tunes_with_fresh_layers(
        dataset, three_class_weights, tmp_path, caplog):
    from fcos_d2.engine.trainer import Trainer

    register_coco_dataset("tiny_weights", str(dataset / "annotations.json"),
                          str(dataset / "images"))
    cfg = tiny_cfg("DATASETS.TRAIN", "('tiny_weights',)", "DATASETS.TEST", "()",
                   "OUTPUT_DIR", str(tmp_path), "MODEL.WEIGHTS", str(three_class_weights))
    trainer = Trainer(cfg)
    # the hooks Trainer registers are those build_hooks returns
    periodic = next(h for h in trainer.build_hooks() if isinstance(h, hooks.PeriodicCheckpointer))
    assert isinstance(trainer.checkpointer, FCOSCheckpointer)
    assert periodic.checkpointer is trainer.checkpointer
    assert "trainer" in trainer.checkpointer.checkpointables  # iteration, optimizer, ...

    head = trainer.model.head
    fresh_classifier = head.cls_logits.weight.detach().clone()
    with caplog.at_level(logging.WARNING):
        trainer.resume_or_load(resume=False)
    given = torch.load(three_class_weights, weights_only=True)["model"]
    assert torch.equal(head.cls_tower[0].weight, given["head.cls_tower.0.weight"])
    assert torch.equal(head.cls_logits.weight, fresh_classifier)
    warning = next(r.getMessage() for r in caplog.records if "fresh" in r.getMessage())
    assert "1 layers keep their fresh initialisation (head.cls_logits)" in warning
    assert "head.cls_logits.weight (3, 64, 3, 3) in the weights, (6, 64, 3, 3) in the " \
           "model" in warning
