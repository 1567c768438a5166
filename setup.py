from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _project_files():
    """(source, path inside the package) of what users run: configs/, tools/, demo/ and
    train_net.py (the list is fcos_d2/project_files.py's PROJECT_FILES)."""
    path = ROOT / "fcos_d2" / "project_files.py"
    namespace = {"__file__": str(path)}
    exec(path.read_text(), namespace)
    for top, patterns in namespace["PROJECT_FILES"]:
        sources = [ROOT / top] if not patterns else \
            [p for pattern in patterns for p in sorted((ROOT / top).glob(pattern))]
        for source in sources:
            yield source, Path("fcos_d2", "project", source.relative_to(ROOT))


class BuildWithProjectFiles(build_py):
    """build_py that also copies the files users run into fcos_d2/project/ of the wheel, so
    that an installed fcos-d2 finds its configs and train_net.py (fcos_d2/project_files.py).
    An editable install reads them from the checkout instead."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for source, inside in _project_files():
            target = Path(self.build_lib) / inside
            self.mkpath(str(target.parent))
            self.copy_file(str(source), str(target))


setup(
    name="fcos_d2",
    version="0.1.0",
    description="FCOS (fully convolutional one-stage object detection) for detectron2",
    packages=find_packages(include=["fcos_d2", "fcos_d2.*"]),
    python_requires=">=3.9",
    # torch, torchvision and detectron2 are installed by the user (see README): detectron2
    # is not on PyPI, and the right torch build depends on the machine.
    install_requires=["fvcore", "iopath", "pycocotools", "Pillow>=10"],
    cmdclass={"build_py": BuildWithProjectFiles},
    entry_points={"console_scripts": ["fcos-d2-train = fcos_d2.train_net:main"]},
)
