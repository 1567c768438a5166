"""The published FCOS weights by name: the table behind ``fcos_d2.model_zoo`` and the
``fcos-d2://NAME`` addresses that the weights cache (``download.py``) resolves.

Each config of ``configs/`` that mirrors a published model names it here, with the address
the official FCOS repo (or AdelaiDet) publishes it at. ``fcos_d2.model_zoo`` builds models
from it; this module holds only the names, addresses and hashes, so that the checkpoint
package needs nothing above it.
"""
from typing import Dict, NamedTuple

__all__ = ["PREFIX", "ModelZooEntry", "MODELS", "register_model_zoo_entry", "resolve_name",
           "get_checkpoint_url", "get_checkpoint_sha256"]

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


# The models of the README's model-zoo table, with the links of the official FCOS README
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


def get_checkpoint_url(name: str) -> str:
    """The URL the weights of model ``name`` are published at."""
    return MODELS[resolve_name(name)].url


def get_checkpoint_sha256(name: str) -> str:
    """The published sha256 of model ``name``'s weights, "" if none is published."""
    return MODELS[resolve_name(name)].sha256
