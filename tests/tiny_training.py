"""Helpers for tests that train a few iterations through train_net.py's Trainer."""
import importlib.util
from pathlib import Path
from types import ModuleType

from fcos_d2.data import synthetic
from fcos_d2.data.register import register_coco_dataset

REPO = Path(__file__).resolve().parents[1]


def load_train_net() -> ModuleType:
    """A fresh import of the repository's train_net.py (it is a script, not a module of the
    package)."""
    spec = importlib.util.spec_from_file_location("train_net", REPO / "train_net.py")
    train_net = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_net)
    return train_net


def register_two_images(folder: Path, name: str) -> None:
    """Writes two synthetic shapes images with their annotations to `folder` and registers
    them as dataset `name`."""
    synthetic.write_split(folder, split="val", num_images=2)
    register_coco_dataset(name, str(folder / "annotations.json"), str(folder / "images"))
