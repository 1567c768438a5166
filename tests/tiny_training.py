"""Helpers for tests that train a few iterations through the library trainer
(``fcos_d2.engine.trainer.Trainer``, train_net.py's)."""
from pathlib import Path

from fcos_d2.data import synthetic
from fcos_d2.data.register import register_coco_dataset

REPO = Path(__file__).resolve().parents[1]  # the repository's root


def register_two_images(folder: Path, name: str) -> None:
    """Writes two synthetic shapes images with their annotations to `folder` and registers
    them as dataset `name`."""
    synthetic.write_split(folder, split="val", num_images=2)
    register_coco_dataset(name, str(folder / "annotations.json"), str(folder / "images"))
