"""Install detectron2 into the current Python environment, unless one is already there.

detectron2 is published as source only. When no detectron2 is installed (a GPU user who
built official detectron2 from source keeps theirs), this installs the Python package of
the PyPI sdist ``pb1-detectron2==0.6``, whose Python files are those of detectron2 v0.6.
That sdist ships no C++ sources, so the package is installed without ``detectron2._C``;
``fcos_d2.compat`` turns any use of an op that needs it into a clear error.

Usage: python tools/install_detectron2.py [--cache DIR]
"""
import argparse
import hashlib
import importlib.util
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST_NAME = "pb1-detectron2"
SDIST_VERSION = "0.6"
SDIST_FILE = f"{SDIST_NAME}-{SDIST_VERSION}.tar.gz"
SDIST_SHA256 = "5d2e9e51e523ec72f6a31cca04b0a515492e9514b773a3d134cedc0677170b29"

# A minimal build description: the sdist's own setup.py insists on compiling the
# extension whose sources it does not ship.
SETUP_PY = """\
from setuptools import find_packages, setup
setup(
    name="detectron2",
    version="{version}",
    description="detectron2 v{version} Python package (from {sdist}, no C++ extension)",
    packages=find_packages(include=["detectron2", "detectron2.*"]),
    package_data={{"detectron2.model_zoo": ["configs/**/*.yaml", "configs/**/*.py"]}},
    include_package_data=True,
)
"""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pip(*args: str) -> None:
    subprocess.check_call([sys.executable, "-m", "pip", *args])


def download_sdist(cache: Path) -> Path:
    target = cache / SDIST_FILE
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        # --no-build-isolation: preparing the sdist's metadata imports torch, which the
        # environment already has; an isolated build env would not.
        pip("download", "--quiet", "--no-deps", "--no-build-isolation", "--no-binary", ":all:",
            f"{SDIST_NAME}=={SDIST_VERSION}", "-d", str(cache))
    actual = sha256_of(target)
    if actual != SDIST_SHA256:
        target.unlink()
        sys.exit(f"{target}: sha256 {actual} does not match the expected {SDIST_SHA256}; "
                 "the file was removed. Refusing to install it.")
    return target


def install_from_sdist(sdist: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        root = Path(tmp) / f"{SDIST_NAME}-{SDIST_VERSION}"
        build = Path(tmp) / "build"
        build.mkdir()
        shutil.copytree(root / "detectron2", build / "detectron2")
        shutil.copy(root / "LICENSE", build / "LICENSE")
        (build / "setup.py").write_text(SETUP_PY.format(version=SDIST_VERSION, sdist=SDIST_FILE))
        pip("install", "--quiet", "--no-deps", "--no-build-isolation", str(build))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=".cache/downloads", type=Path,
                        help="where the verified sdist is kept between runs")
    args = parser.parse_args()
    spec = importlib.util.find_spec("detectron2")
    if spec is not None:
        print(f"detectron2 already installed at {Path(spec.origin).parent}; keeping it.")
        return
    install_from_sdist(download_sdist(args.cache))
    print(f"installed detectron2 {SDIST_VERSION} from {SDIST_FILE} (sha256 verified, "
          "no C++ extension)")


if __name__ == "__main__":
    main()
