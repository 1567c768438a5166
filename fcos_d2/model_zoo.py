"""The official FCOS models by name, as detectron2's ``model_zoo`` offers its own.

Each config of ``configs/`` that mirrors a published model names it here, with the address
the official FCOS repo (or AdelaiDet) publishes it at. The weights load as published: the
checkpointer recognises their layout and converts them in memory
(``fcos_d2/checkpoint/layouts.py``). A model's name is its config's file name without
``.yaml`` (``"FCOS-R50"``); the official name (``"FCOS_imprv_R_50_FPN_1x"``) works too.

    model = fcos_d2.model_zoo.get("FCOS-R50", trained=True)   # COCO weights, downloaded once
    cfg.MODEL.WEIGHTS = "fcos-d2://FCOS-R50"                  # the same, in a config

Downloads go through the weights cache (``fcos_d2/checkpoint/download.py``). No sha256 is
published for these files: the first download's hash is recorded in the cache, and later
downloads of the same URL must match it.
"""
from typing import Dict, NamedTuple, Optional

__all__ = ["PREFIX", "ModelZooEntry", "MODELS", "register_model_zoo_entry", "resolve_name", "get_config_file",
           "get_checkpoint_url", "get_checkpoint_sha256", "get_config", "get"]

PREFIX = "fcos-d2://"
_CLOUDSTOR = "https://cloudstor.aarnet.edu.au/plus/s/{}/download"


class ModelZooEntry(NamedTuple):
    """A published model: its config in ``configs/``, its official name, where it is
    published, its URL and its sha256 ("" where none is published)."""
    config: str
    official_name: str
    published_by: str
    url: str
    sha256: str = ""


def _entry(config: str, official_name: str, published_by: str, share: str) -> ModelZooEntry:
    return ModelZooEntry(config, official_name, published_by, _CLOUDSTOR.format(share))


# The models of the README's configs table, with the links of the official FCOS README
# (the official FCOS repository) and of AdelaiDet's configs/FCOS-Detection/README.md.
MODELS: Dict[str, ModelZooEntry] = {
    "FCOS-R50": _entry("FCOS-R50.yaml", "FCOS_imprv_R_50_FPN_1x", "FCOS", "ZSAqNJB96hA71Yf"),
    "FCOS-R50-original": _entry("FCOS-R50-original.yaml", "FCOS_R_50_FPN_1x", "FCOS",
                                "dDeDPBLEAt19Xrl"),
    "FCOS-R50-DCNv2": _entry("FCOS-R50-DCNv2.yaml", "FCOS_imprv_dcnv2_R_50_FPN_1x", "FCOS",
                             "plKgHuykjiilzWr"),
    "FCOS-R50-2x-MS": _entry("FCOS-R50-2x-MS.yaml", "FCOS_MS_R_50_2x", "AdelaiDet",
                             "reA6HVaGX47yKGV"),
    "FCOS-R101-2x-MS": _entry("FCOS-R101-2x-MS.yaml", "FCOS_imprv_R_101_FPN_2x", "FCOS",
                              "hTeMuRa4pwtCemq"),
    "FCOS-X101-64x4d-2x-MS": _entry("FCOS-X101-64x4d-2x-MS.yaml",
                                    "FCOS_imprv_X_101_64x4d_FPN_2x", "FCOS", "rKOJtwvJwcKVOz8"),
    "FCOS-RT-R50": _entry("FCOS-RT-R50.yaml", "FCOS_RT_MS_R_50_4x", "AdelaiDet",
                          "TlnlXUr6lNNSyoZ"),
}


def register_model_zoo_entry(name: str, entry: ModelZooEntry) -> ModelZooEntry:
    """Adds a member's published model as ``fcos-d2://<name>`` (replacing one of the same
    name); members call it at import, so that the core names none of them."""
    MODELS[name] = entry
    return entry


def resolve_name(name: str) -> str:
    """The model-zoo name of ``name``: a name, ``fcos-d2://name``, a config file name
    (``"FCOS-R50.yaml"``) or an official name.

    Raises:
        KeyError: naming ``name`` and listing the models there are.
    """
    key = name[len(PREFIX):] if name.startswith(PREFIX) else name
    key = key[:-len(".yaml")] if key.endswith(".yaml") else key
    if key in MODELS:
        return key
    for zoo_name, entry in MODELS.items():
        if entry.official_name == key:
            return zoo_name
    raise KeyError(f"fcos-d2 model zoo: no model '{name}'; the models are "
                   + ", ".join(MODELS) + " (or their official names: "
                   + ", ".join(e.official_name for e in MODELS.values()) + ")")


def get_config_file(name: str) -> str:
    """The path of the config of model ``name`` (see ``resolve_name``)."""
    from .config import get_config_file as config_path

    return config_path(MODELS[resolve_name(name)].config)


def get_checkpoint_url(name: str) -> str:
    """The URL the weights of model ``name`` are published at."""
    return MODELS[resolve_name(name)].url


def get_checkpoint_sha256(name: str) -> str:
    """The published sha256 of model ``name``'s weights, "" if none is published."""
    return MODELS[resolve_name(name)].sha256


def get_config(name: str, trained: bool = False):
    """The config of model ``name`` (a detectron2 CfgNode with ``add_fcos_config``), with
    ``MODEL.WEIGHTS = "fcos-d2://<name>"`` when ``trained``."""
    from detectron2.config import get_cfg

    from .config import add_fcos_config

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
    import torch
    from detectron2.modeling import build_model

    from .checkpoint import FCOSCheckpointer

    cfg = get_config(name, trained)
    cfg.MODEL.DEVICE = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(cfg)
    FCOSCheckpointer.from_config(cfg, model).load(cfg.MODEL.WEIGHTS)
    return model.eval() if trained else model
