import os
import tempfile
from pathlib import Path

# Under pytest-xdist (`make test` runs 2 workers), each worker and the processes its tests
# start get their share of the cores instead of all of them: two workers of 2 threads
# each on 2 cores make OpenMP threads wait for a core. Set before torch is imported.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))

# MODEL.FCOS.INFERENCE_BACKEND "auto" would run bf16 (and compile) on a CPU with native
# bf16: the suite tests the model in eager float32, the same on every CPU, and auto's own
# tests unset this (tests/modeling/test_backend_choice.py). Inherited by the scripts run.
os.environ.setdefault("FCOS_D2_AUTO_BACKEND", "eager")
# Compiled backends' caches (fcos_d2/modeling/compile_cache.py) in a folder of the suite's
# own, kept between runs like inductor's default one, not in the user's ~/.cache.
os.environ.setdefault("FCOS_D2_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"fcos_d2_tests_{getattr(os, 'getuid', lambda: 0)()}"))

import pytest


def pytest_configure(config):
    """Imports fcos_d2 (its compatibility shims go before detectron2's modules) in every
    process that collects tests, but not in pytest-xdist's controller, which only hands
    them out to the workers: there the import cost 12 s of CPU while they started."""
    distributing = getattr(config.option, "dist", "no") != "no" and not config.option.collectonly
    if distributing and not hasattr(config, "workerinput"):
        return
    import fcos_d2  # noqa: F401


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """A 4-image COCO dataset of synthetic shapes (the first val images), written per test
    module: ``annotations.json`` and ``images/``."""
    from fcos_d2.data import synthetic

    folder = tmp_path_factory.mktemp("tiny_coco")
    synthetic.write_split(folder, split="val", num_images=4)
    return folder


@pytest.fixture(scope="session")
def scripts():
    """Runs this repository's scripts (train_net.py, tools/, demo/) in processes forked from
    one server per pytest worker that has imported torch, detectron2 and fcos_d2 once
    (tests/training_processes.py): ``scripts.run(script, *argv)`` is ``subprocess.run`` of
    ``python script *argv`` in the repository's root; ``start``/``wait`` add faults."""
    from training_processes import TrainingProcesses

    server = TrainingProcesses()
    yield server
    server.close()
