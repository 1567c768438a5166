"""fcos-d2 as a real package: the wheel `pip install .` builds, installed (not editable) into a
fresh virtual environment, works from another directory.

Offline: the wheel is built with this environment's setuptools, and the new environment
reuses this environment's packages (torch, detectron2, ...) through a .pth file, so that
nothing is downloaded; only fcos_d2 itself comes from the wheel."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("setup.py", "MANIFEST.in", "README.md", "requirements.txt", "train_net.py",
           "fcos_d2", "configs", "tools", "demo")

# Runs inside the new environment, from a directory outside the checkout.
CHECK = r"""
import json, sys
import numpy as np, torch
import fcos_d2
from detectron2.config import get_cfg
from detectron2.modeling import build_model

cfg = get_cfg()
fcos_d2.add_fcos_config(cfg)
cfg.merge_from_file(fcos_d2.get_config_file("quickstart.yaml"))
cfg.MODEL.DEVICE = "cpu"
torch.save({"model": build_model(cfg).state_dict()}, "weights.pth")
cfg.MODEL.WEIGHTS = "weights.pth"
image = np.random.default_rng(0).integers(0, 256, (96, 160, 3), dtype=np.uint8)
instances = fcos_d2.Predictor(cfg)(image)
print(json.dumps({"package": fcos_d2.__file__,
                  "config": fcos_d2.get_config_file("FCOS-R50.yaml"),
                  "image_size": list(instances.image_size),
                  "fields": sorted(instances.get_fields())}))

# what `python -m fcos_d2.train_net --help` does, in this process (each process imports torch)
import contextlib, io, runpy
help_text = io.StringIO()
sys.argv = ["fcos_d2.train_net", "--help"]
with contextlib.redirect_stdout(help_text), contextlib.suppress(SystemExit):
    runpy.run_module("fcos_d2.train_net", run_name="__main__", alter_sys=True)
print(json.dumps({"help": help_text.getvalue()}))
"""


def build_wheel(tmp_path: Path) -> Path:
    """`pip wheel` of a copy of the sources (the checkout stays clean), without network."""
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(tmp_path / "dist"), str(source)], check=True,
                   capture_output=True)
    [wheel] = (tmp_path / "dist").glob("fcos_d2-*.whl")
    return wheel


def fresh_venv_with_wheel(tmp_path: Path, wheel: Path) -> Path:
    """A new virtual environment with the wheel installed and this environment's packages
    visible behind it; returns its bin/ folder."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], check=True, capture_output=True, text=True)
    reuse = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib.stdout.strip(), "reuse_project_venv.pth").write_text("\n".join(sorted(reuse)))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    return venv / "bin"


def run_outside(command, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("package")
    wheel = build_wheel(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return wheel, fresh_venv_with_wheel(tmp_path, wheel), elsewhere


def test_the_wheel_carries_the_configs_tools_demo_and_train_net(installed):
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = ["train_net.py", *[str(p.relative_to(REPO)) for top in ("configs", "tools", "demo")
                                  for p in (REPO / top).rglob("*") if p.suffix in (".py", ".yaml")]]
    missing = [name for name in expected if f"fcos_d2/project/{name}" not in names]
    assert not missing and "fcos_d2/model_zoo.py" in names


def test_the_installed_package_finds_its_configs_predicts_and_runs_train_net_as_a_module(
        installed):
    _, bin_dir, elsewhere = installed
    result = run_outside([str(bin_dir / "python"), "-c", CHECK], cwd=elsewhere)
    assert result.returncode == 0, result.stderr[-3000:]
    *_, line, help_line = result.stdout.strip().splitlines()
    report = json.loads(line)
    site = str(bin_dir.parent / "lib")
    assert report["package"].startswith(site), report  # the wheel's copy, not the checkout
    assert report["config"].startswith(site) and report["config"].endswith(
        "fcos_d2/project/configs/FCOS-R50.yaml")
    assert report["image_size"] == [96, 160]
    assert report["fields"] == ["pred_boxes", "pred_classes", "scores"]
    assert_train_net_help(json.loads(help_line)["help"])


def test_train_net_runs_as_the_installed_fcos_d2_train_command(installed):
    _, bin_dir, elsewhere = installed
    result = run_outside([str(bin_dir / "fcos-d2-train"), "--help"], cwd=elsewhere)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_train_net_help(result.stdout)


def assert_train_net_help(text: str) -> None:
    assert "--config-file" in text and "--eval-only" in text and "--register-coco" in text, text
