import sys
from pathlib import Path

import pytest

# Test helpers (e.g. reference_case.py) import by module name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fcos_d2  # noqa: E402,F401  (before detectron2: compatibility shims)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """A 4-image COCO dataset of synthetic shapes (the first val images), written per test
    module: ``annotations.json`` and ``images/``."""
    from fcos_d2.data import synthetic

    folder = tmp_path_factory.mktemp("tiny_coco")
    synthetic.write_split(folder, split="val", num_images=4)
    return folder
