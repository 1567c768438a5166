"""Multi-scale training configs sample the shorter side from 640 to 800; the batch and
learning rate follow --num-gpus only when SOLVER.REFERENCE_WORLD_SIZE asks for it."""
import glob
from pathlib import Path

import pytest
from detectron2.config import get_cfg
from detectron2.data import detection_utils
from detectron2.data.transforms import ResizeShortestEdge
from detectron2.engine import DefaultTrainer

from fcos_d2 import add_fcos_config, get_config_file

CONFIGS = sorted(Path(p).name for p in glob.glob(
    str(Path(__file__).resolve().parents[2] / "configs" / "*.yaml")))


def load(name: str):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(get_config_file(name))
    return cfg


def train_resize(cfg) -> ResizeShortestEdge:
    augmentations = detection_utils.build_augmentation(cfg, is_train=True)
    return next(a for a in augmentations if isinstance(a, ResizeShortestEdge))


@pytest.mark.parametrize("name, sizes, style", [
    ("FCOS-R50-2x-MS.yaml", (640, 672, 704, 736, 768, 800), "choice"),  # as AdelaiDet
    ("FCOS-R101-2x-MS.yaml", (640, 800), "range"),  # as the official: any integer in between
    ("FCOS-X101-64x4d-2x-MS.yaml", (640, 800), "range"),
])
def test_multi_scale_configs_train_on_shorter_sides_from_640_to_800_for_180k_iterations(
        name, sizes, style):
    cfg = load(name)
    resize = train_resize(cfg)
    assert (tuple(resize.short_edge_length), resize.sample_style, resize.max_size) == \
        (sizes, style, 1333)
    assert (cfg.SOLVER.MAX_ITER, tuple(cfg.SOLVER.STEPS), cfg.INPUT.MIN_SIZE_TEST) == \
        (180000, (120000, 160000), 800)


@pytest.mark.parametrize("name", CONFIGS)
def test_configs_keep_their_batch_and_lr_whatever_the_number_of_gpus(name):
    cfg = load(name)
    assert cfg.SOLVER.REFERENCE_WORLD_SIZE == 0
    scaled = DefaultTrainer.auto_scale_workers(cfg, 4)
    assert (scaled.SOLVER.IMS_PER_BATCH, scaled.SOLVER.BASE_LR, scaled.SOLVER.MAX_ITER) == \
        (cfg.SOLVER.IMS_PER_BATCH, cfg.SOLVER.BASE_LR, cfg.SOLVER.MAX_ITER)


def test_reference_world_size_8_on_4_gpus_halves_batch_and_lr_and_doubles_the_schedule():
    cfg = load("FCOS-R50.yaml")
    cfg.SOLVER.REFERENCE_WORLD_SIZE = 8  # the official 8 GPUs x 2 images
    cfg.TEST.EVAL_PERIOD = 5000
    scaled = DefaultTrainer.auto_scale_workers(cfg, 4)
    solver = scaled.SOLVER
    assert (solver.IMS_PER_BATCH, solver.BASE_LR) == (8, pytest.approx(0.005))
    assert (solver.MAX_ITER, tuple(solver.STEPS), solver.WARMUP_ITERS) == \
        (180000, (120000, 160000), 1000)
    assert (solver.CHECKPOINT_PERIOD, scaled.TEST.EVAL_PERIOD) == (10000, 10000)
    assert solver.REFERENCE_WORLD_SIZE == 4
