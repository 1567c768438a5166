#!/usr/bin/env python
"""Trains and evaluates FCOS and its family with detectron2's DefaultTrainer.

    python train_net.py --config-file configs/FCOS-R50.yaml --num-gpus 8
    python train_net.py --config-file configs/FCOS-R50.yaml --eval-only MODEL.WEIGHTS model.pth

The trainer is a library (``fcos_d2.engine.trainer``); ``fcos-d2-train`` and
``python -m fcos_d2.train_net`` run the same thing from any directory.
"""
import fcos_d2  # noqa: F401  (first: detectron2 v0.6 shims; registers FCOS, members, datasets)
from fcos_d2.engine.trainer import Trainer, argument_parser, main, run_from_command_line, setup

__all__ = ["Trainer", "argument_parser", "main", "setup"]

if __name__ == "__main__":
    run_from_command_line()
