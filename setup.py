from setuptools import find_packages, setup

setup(
    name="fcos_d2",
    version="0.1.0",
    description="FCOS (fully convolutional one-stage object detection) for detectron2",
    packages=find_packages(include=["fcos_d2", "fcos_d2.*"]),
    python_requires=">=3.9",
    # torch, torchvision and detectron2 are installed by the user (see README): detectron2
    # is not on PyPI, and the right torch build depends on the machine.
    install_requires=["fvcore", "iopath", "pycocotools", "Pillow>=10"],
)
