"""The official FCOS models by name, as detectron2's ``model_zoo`` offers its own.

Each config of ``configs/`` that mirrors a published model is named in the table of
``fcos_d2/checkpoint/published.py``, with the address the official FCOS repo (or AdelaiDet)
publishes it at; the weights cache resolves ``fcos-d2://NAME`` through it. The weights
load as published: the checkpointer recognises their layout and converts them in memory
(``fcos_d2/checkpoint/layouts.py``). A model's name is its config's file name without
``.yaml`` (``"FCOS-R50"``); the official name (``"FCOS_imprv_R_50_FPN_1x"``) works too.

    model = fcos_d2.model_zoo.get("FCOS-R50", trained=True)   # COCO weights, downloaded once
    cfg.MODEL.WEIGHTS = "fcos-d2://FCOS-R50"                  # the same, in a config

Downloads go through the weights cache (``fcos_d2/checkpoint/download.py``). No sha256 is
published for these files: the first download's hash is recorded in the cache, and later
downloads of the same URL must match it.
"""
from typing import Optional

import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model

from .checkpoint import FCOSCheckpointer
from .checkpoint.published import (MODELS, PREFIX, ModelZooEntry, get_checkpoint_sha256,
                                   get_checkpoint_url, register_model_zoo_entry, resolve_name)
from .config import add_fcos_config
from .config import get_config_file as config_path

__all__ = ["PREFIX", "ModelZooEntry", "MODELS", "register_model_zoo_entry", "resolve_name",
           "get_config_file", "get_checkpoint_url", "get_checkpoint_sha256", "get_config", "get"]


def get_config_file(name: str) -> str:
    """The path of the config of model ``name`` (see ``resolve_name``)."""
    return config_path(MODELS[resolve_name(name)].config)


def get_config(name: str, trained: bool = False):
    """The config of model ``name`` (a detectron2 CfgNode with ``add_fcos_config``), with
    ``MODEL.WEIGHTS = "fcos-d2://<name>"`` when ``trained``."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(get_config_file(name))
    if trained:
        cfg.MODEL.WEIGHTS = PREFIX + resolve_name(name)
    return cfg


def get(name: str, trained: bool = False, device: Optional[str] = None):
    """Model ``name`` built from its config, as detectron2's ``model_zoo.get``.

    Args:
        name: see ``resolve_name``.
        trained: load the published COCO weights (downloaded once into the cache); else
            the config's own ``MODEL.WEIGHTS`` (ImageNet backbone weights, for training).
        device: where the model lives; default "cuda" if available, else "cpu".

    Returns:
        The model (``fcos_d2.FCOS``), in eval mode when ``trained``.
    """
    cfg = get_config(name, trained)
    cfg.MODEL.DEVICE = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(cfg)
    FCOSCheckpointer.from_config(cfg, model).load(cfg.MODEL.WEIGHTS)
    return model.eval() if trained else model
