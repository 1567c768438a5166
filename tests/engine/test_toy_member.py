"""A member of the family plugs in from its own files alone: this test file registers a toy
member (a META_ARCH, its config node MODEL.TOY, a checkpoint layout and a trainer
extension), trains it a few iterations through the library trainer, evaluates it, and
loads a checkpoint in its foreign layout through MODEL.WEIGHTS, with no edit to the core.

The toy: an FCOS whose head runs at MODEL.TOY.HEAD_WIDTH channels (a 1 x 1 convolution
narrows the FPN's 64 channels to 32 first). Its foreign layout stores every tensor under
``toy_net.`` with the narrowing convolution called ``squeeze``. Its trainer extension adds
MODEL.TOY.EXTRA_ITERS to the schedule, refuses a width below 1, labels its evaluations
"toy" and records what the trainer asked of it.
"""
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
import torch
from detectron2.config import CfgNode as CN
from detectron2.data import DatasetCatalog
from detectron2.engine import HookBase
from detectron2.layers import ShapeSpec
from detectron2.modeling import META_ARCH_REGISTRY
from torch import nn

from fcos_d2.checkpoint import FCOSCheckpointer
from fcos_d2.checkpoint.layouts import (CheckpointLayout, register_checkpoint_layout,
                                        registered_checkpoint_layouts,
                                        unregister_checkpoint_layout)
from fcos_d2.config import (register_config_node, registered_config_nodes,
                            unregister_config_node)
from fcos_d2.data.register import register_coco_dataset
from fcos_d2.engine.trainer import Trainer, argument_parser, main, setup
from fcos_d2.modeling import FCOS, FCOSHead
from fcos_d2.trainer_extensions import (TrainerExtension, register_trainer_extension,
                                        registered_trainer_extensions,
                                        unregister_trainer_extension)

REPO = Path(__file__).resolve().parents[2]
FOREIGN_PREFIX = "toy_net."


def add_toy_config(cfg: CN) -> None:
    """MODEL.TOY: the toy member's node."""
    if "TOY" in cfg.MODEL:
        return
    cfg.MODEL.TOY = CN()
    cfg.MODEL.TOY.HEAD_WIDTH = 32  # channels of the head's convolutions (GroupNorm: 32k)
    cfg.MODEL.TOY.EXTRA_ITERS = 0  # added to SOLVER.MAX_ITER by the trainer's setup


class ToyHead(nn.Module):
    """A 1 x 1 convolution from the FPN's width to ``width``, then FCOS's head."""

    def __init__(self, cfg, input_shape: List[ShapeSpec], width: int):
        super().__init__()
        self.narrow = nn.Conv2d(input_shape[0].channels, width, kernel_size=1)
        self.fcos = FCOSHead(cfg, [ShapeSpec(channels=width, stride=s.stride)
                                   for s in input_shape])

    def forward(self, features):
        return self.fcos([self.narrow(x) for x in features])  # (N, width, Hi, Wi) each


class ToyFCOS(FCOS):
    """FCOS with the toy head."""

    @classmethod
    def build_head(cls, cfg, input_shape, features=None):
        return ToyHead(cfg, input_shape, cfg.MODEL.TOY.HEAD_WIDTH)


def to_foreign(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {FOREIGN_PREFIX + k.replace(".narrow.", ".squeeze."): v for k, v in state.items()}


def from_foreign(state: Dict[str, torch.Tensor], model: nn.Module):
    converted = {k[len(FOREIGN_PREFIX):].replace(".squeeze.", ".narrow."): v
                 for k, v in state.items()}
    return converted, ["renamed by the toy layout"]


class RecordIterations(HookBase):
    def __init__(self, record: List[int]):
        self.record = record

    def after_step(self):
        self.record.append(self.trainer.iter)


class ToyExtension(TrainerExtension):
    name = "toy"
    meta_architectures = ("ToyFCOS",)

    def __init__(self):
        self.loads: List[bool] = []  # ``resuming`` of every after_load
        self.iterations: List[int] = []  # recorded by the hook it adds
        self.mappers: List[str] = []  # class names of the test mappers it was given

    def check_config(self, cfg):
        if cfg.MODEL.TOY.HEAD_WIDTH < 1:
            raise ValueError(f"MODEL.TOY.HEAD_WIDTH: must be >= 1, got {cfg.MODEL.TOY.HEAD_WIDTH}")

    def adjust_config(self, cfg):
        cfg.SOLVER.MAX_ITER += cfg.MODEL.TOY.EXTRA_ITERS

    def after_load(self, model, cfg, *, resuming):
        self.loads.append(resuming)

    def test_mapper(self, cfg, default):
        self.mappers.append(type(default).__name__)
        return default

    def test_model(self, cfg, model):
        return model, "toy"

    def hooks(self, cfg):
        return [RecordIterations(self.iterations)]


@contextmanager
def registered_toy() -> Iterator[ToyExtension]:
    """The toy member registered as a member registers itself, and removed on exit."""
    META_ARCH_REGISTRY.register(ToyFCOS)
    register_config_node(add_toy_config)
    layout = register_checkpoint_layout(CheckpointLayout(
        "toy", "a toy member's checkpoint",
        lambda keys: all(k.startswith(FOREIGN_PREFIX) for k in keys), from_foreign))
    extension = register_trainer_extension(ToyExtension())
    try:
        yield extension
    finally:
        unregister_trainer_extension(extension.name)
        unregister_checkpoint_layout(layout.name)
        unregister_config_node(add_toy_config)
        # fvcore's Registry has no public removal; its map is the registry itself
        META_ARCH_REGISTRY._obj_map.pop("ToyFCOS")


def registrations():
    """Whether each of the toy's four registrations is in place."""
    return ("ToyFCOS" in META_ARCH_REGISTRY, add_toy_config in registered_config_nodes(),
            "toy" in [layout.name for layout in registered_checkpoint_layouts()],
            "toy" in [extension.name for extension in registered_trainer_extensions()])


@pytest.fixture(scope="module")
def toy():
    """The toy member, registered for this module's tests only."""
    with registered_toy() as extension:
        yield extension


# first in the file: before the module's `toy` fixture registers the toy
def test_the_registrations_are_removed_on_exit_so_other_tests_never_see_the_toy():
    assert registrations() == (False, False, False, False)
    with registered_toy():
        assert registrations() == (True, True, True, True)
    assert registrations() == (False, False, False, False)


@pytest.fixture(scope="module")
def toy_tiny(dataset):
    """conftest's 4-image dataset, registered as "toy_tiny" (once per process)."""
    if "toy_tiny" not in DatasetCatalog.list():
        register_coco_dataset("toy_tiny", str(dataset / "annotations.json"),
                              str(dataset / "images"))
    return "toy_tiny"


def arguments(output, *opts, flags=()):
    """The command line of a tiny toy training on "toy_tiny" (64-px images, 2 a batch,
    FPN width 64, 2 iterations, every detection kept) into ``output``."""
    return argument_parser().parse_args(map(str, [
        "--config-file", REPO / "configs" / "quickstart.yaml", *flags,
        "MODEL.META_ARCHITECTURE", "ToyFCOS", "MODEL.DEVICE", "cpu", "MODEL.FPN.OUT_CHANNELS", 64,
        "MODEL.FCOS.NUM_CONVS", 1, "MODEL.FCOS.INFERENCE_TH_TEST", 0.0, "SEED", 3,
        "SOLVER.AMP.ENABLED", False, "SOLVER.IMS_PER_BATCH", 2, "SOLVER.MAX_ITER", 2,
        "SOLVER.WARMUP_ITERS", 1, "SOLVER.CHECKPOINT_PERIOD", 100,
        "INPUT.MIN_SIZE_TRAIN", (64,), "INPUT.MAX_SIZE_TRAIN", 64, "INPUT.MIN_SIZE_TEST", 64,
        "INPUT.MAX_SIZE_TEST", 64, "DATASETS.TRAIN", ("toy_tiny",),
        "DATASETS.TEST", ("toy_tiny",), "OUTPUT_DIR", output, *opts]))


@pytest.fixture(scope="module")
def trained(toy, toy_tiny, tmp_path_factory):
    """The output folder of a toy training of 2 + 1 extra iterations, evaluated once."""
    output = tmp_path_factory.mktemp("toy")
    main(arguments(output, "MODEL.TOY.EXTRA_ITERS", 1))
    return output


def test_the_toy_trains_with_its_own_head_width_and_the_extension_steps(toy, trained):
    weights = torch.load(trained / "model_final.pth", weights_only=True)
    assert weights["iteration"] == 2  # MAX_ITER 2 + EXTRA_ITERS 1 (adjust_config)
    assert weights["model"]["head.narrow.weight"].shape == (32, 64, 1, 1)
    assert weights["model"]["head.fcos.cls_logits.weight"].shape[1] == 32
    assert toy.iterations == [0, 1, 2] and toy.loads == [False]
    assert toy.mappers == ["FCOSDatasetMapper"]
    summary = (trained / "inference" / "toy_tiny" / "summary.txt").read_text()
    assert summary.count("== toy_tiny [toy] |") == 1


def test_the_toy_loads_its_foreign_layout_through_model_weights(toy, trained, tmp_path):
    own = torch.load(trained / "model_final.pth", weights_only=True)["model"]
    torch.save({"model": to_foreign(own)}, tmp_path / "foreign.pth")
    cfg = setup(arguments(tmp_path / "eval", "MODEL.WEIGHTS", tmp_path / "foreign.pth",
                          flags=["--eval-only"]))
    model = Trainer.build_model(cfg)
    FCOSCheckpointer.from_config(cfg, model).resume_or_load(cfg.MODEL.WEIGHTS, resume=False)
    loaded = model.state_dict()
    assert loaded.keys() == own.keys()
    assert all(torch.equal(loaded[k].cpu(), v) for k, v in own.items())
    evaluated = {name: main(arguments(tmp_path / name, "MODEL.WEIGHTS", weights,
                                      flags=["--eval-only"]))["bbox"]
                 for name, weights in (("foreign", tmp_path / "foreign.pth"),
                                       ("own", trained / "model_final.pth"))}
    assert evaluated["foreign"] == pytest.approx(evaluated["own"], nan_ok=True)
    assert "toy_tiny [toy]" in (tmp_path / "foreign" / "inference" / "toy_tiny" /
                                "summary.txt").read_text()


def test_the_extension_check_refuses_a_bad_toy_setting(toy, toy_tiny, tmp_path):
    with pytest.raises(ValueError, match="MODEL.TOY.HEAD_WIDTH: must be >= 1, got 0"):
        setup(arguments(tmp_path, "MODEL.TOY.HEAD_WIDTH", 0))
