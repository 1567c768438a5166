"""``add_fad_config``: the ``MODEL.FAD`` node and the architecture optimizer's
``SOLVER.ARCH_*`` keys (called by ``add_fcos_config``).

FAD also reads ``MODEL.FCOS`` (assignment, losses, detections: FAD's models are
FCOS-imprv) and, in the search, ``SOLVER`` (the weights' SGD, its schedule and
``CLIP_GRADIENTS``). Defaults are FAD's release's (R-50 1x, C = 96, the paper's genotypes).
"""
from typing import Any, Dict, Optional

from detectron2.config import CfgNode as CN

from ...config import register_config_node
from .genotypes import (PAPER_BOX, PAPER_CLS, Genotype, from_config_value, read_genotype_file,
                        to_config_value)


@register_config_node  # add_fcos_config adds it
def add_fad_config(cfg: CN) -> None:
    """Adds ``MODEL.FAD`` and ``SOLVER.ARCH_*`` to ``cfg`` in place. Safe to call twice."""
    if "FAD" in cfg.MODEL:
        return
    cfg.MODEL.FAD = _C = CN()
    # Searched towers: False keeps FCOS's plain tower of MODEL.FCOS.NUM_CONVS convs there.
    _C.BOX_TOWER = True
    _C.CLS_TOWER = True
    # Cells a tower in the trained model (FAD: 2; the second pre-processes the first's
    # concatenation to the feature channels with a 1x1 conv + GN + ReLU).
    _C.NUM_CELLS_BOX = 2
    _C.NUM_CELLS_CLS = 2
    # Intermediate nodes a cell (FAD: 3; a cell outputs their concatenation, 3 x 256).
    _C.NUM_NODES_BOX = 3
    _C.NUM_NODES_CLS = 3
    # Channels C of an edge's operation, between its 1x1 convs F -> C -> F (FAD: 96 for
    # 128 for X-101); a multiple of 32 (GN's groups).
    _C.NUM_CHANNELS_BOX = 96
    _C.NUM_CHANNELS_CLS = 96
    # The towers' genotypes: per node a list of [operation, source state] pairs
    # (fcos_d2/modeling/fad/genotypes.py). Default: the paper's.
    _C.GENO_BOX = to_config_value(PAPER_BOX)
    _C.GENO_CLS = to_config_value(PAPER_CLS)
    # A genotype file (FAD's two-line genotype.log, or the YAML form with box: and cls:),
    # as the search writes them; when set, it replaces GENO_BOX and GENO_CLS.
    _C.GENOTYPE_FILE = ""

    _C.SEARCH = CN()
    # Share intermediate results among each family's five candidates (RepShare); False
    # computes the ten candidates separately (for measuring what RepShare saves).
    _C.SEARCH.REPSHARE = True
    # Search cells a tower (FAD: 1).
    _C.SEARCH.NUM_CELLS = 1
    # Fraction of DATASETS.TRAIN's images held out for the architecture step; the weight
    # step trains on the rest (disjoint, split by SEARCH.SEED).
    _C.SEARCH.ARCH_SPLIT = 0.5
    # Write the genotype (OUTPUT_DIR/genotype.log and genotype.yaml) every this many
    # iterations, and always at the end.
    _C.SEARCH.GENOTYPE_PERIOD = 100
    # Second-order DARTS (the unrolled weights' gradient, with a finite-difference
    # Hessian-vector product); False: first order (FAD's default).
    _C.SEARCH.SECOND_ORDER = False
    # Seed of the split, the batches and the augmentation (a search resumes exactly).
    _C.SEARCH.SEED = 0
    # A trained detector's checkpoint whose backbone.bottom_up.* start the supernet's
    # bottom-up (after MODEL.WEIGHTS), e.g. the recipe's model_final.pth; "" for none.
    _C.SEARCH.BOTTOM_UP_WEIGHTS = ""

    # The architecture weights' Adam (DARTS's and FAD's: lr 3e-4, betas (0.5, 0.999),
    # weight decay 1e-3). Not in the weights' optimizer.
    cfg.SOLVER.ARCH_BASE_LR = 3e-4
    cfg.SOLVER.ARCH_BETAS = (0.5, 0.999)
    cfg.SOLVER.ARCH_WEIGHT_DECAY = 1e-3


def _positive_int(cfg: CN, key: str) -> int:
    value = cfg.MODEL.FAD[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"MODEL.FAD.{key}: expected an integer >= 1, got {value!r}")
    return value


def _channels(cfg: CN, key: str) -> int:
    value = _positive_int(cfg, key)
    if value % 32:
        raise ValueError(f"MODEL.FAD.{key}: {value} is not a multiple of 32 (GN's groups)")
    return value


def fad_genotypes(cfg: CN) -> Dict[str, Optional[Genotype]]:
    """The box and classification genotypes of ``cfg`` (GENOTYPE_FILE, else GENO_BOX and
    GENO_CLS), None for a plain tower, checked against NUM_NODES_BOX / NUM_NODES_CLS."""
    fad = cfg.MODEL.FAD
    if fad.GENOTYPE_FILE:
        box, cls = read_genotype_file(fad.GENOTYPE_FILE)
    else:
        box = from_config_value(fad.GENO_BOX, what="MODEL.FAD.GENO_BOX")
        cls = from_config_value(fad.GENO_CLS, what="MODEL.FAD.GENO_CLS")
    result = {}
    for name, switch, genotype, nodes in (("box", "BOX_TOWER", box, "NUM_NODES_BOX"),
                                          ("cls", "CLS_TOWER", cls, "NUM_NODES_CLS")):
        if not isinstance(fad[switch], bool):
            raise ValueError(f"MODEL.FAD.{switch}: expected True or False, got {fad[switch]!r}")
        if fad[switch] and genotype.num_nodes != _positive_int(cfg, nodes):
            raise ValueError(f"MODEL.FAD.{nodes}: {fad[nodes]}, but the {name} genotype has "
                             f"{genotype.num_nodes} nodes")
        result[name] = genotype if fad[switch] else None
    return result


def fad_head_options(cfg: CN) -> Dict[str, Any]:
    """FADHead's keyword arguments from MODEL.FAD and MODEL.FCOS, every key checked."""
    genotypes = fad_genotypes(cfg)
    return {"box_genotype": genotypes["box"], "cls_genotype": genotypes["cls"],
            **head_common_options(cfg)}


def head_common_options(cfg: CN) -> Dict[str, Any]:
    """The keyword arguments FADHead and FADSearchHead share (no genotypes), checked."""
    fcos = cfg.MODEL.FCOS
    return {
        "num_classes": fcos.NUM_CLASSES,
        "box_channels": _channels(cfg, "NUM_CHANNELS_BOX"),
        "cls_channels": _channels(cfg, "NUM_CHANNELS_CLS"),
        "num_cells_box": _positive_int(cfg, "NUM_CELLS_BOX"),
        "num_cells_cls": _positive_int(cfg, "NUM_CELLS_CLS"),
        "num_convs": fcos.NUM_CONVS,
        "prior_prob": fcos.PRIOR_PROB,
        "reg_activation": fcos.REG_ACTIVATION or ("relu" if fcos.NORM_REG_TARGETS else "exp"),
    }


def search_options(cfg: CN) -> Dict[str, Any]:
    """The search's settings from MODEL.FAD.SEARCH and SOLVER.ARCH_*, every key checked."""
    search, solver = cfg.MODEL.FAD.SEARCH, cfg.SOLVER
    if not isinstance(search.REPSHARE, bool) or not isinstance(search.SECOND_ORDER, bool):
        raise ValueError(f"MODEL.FAD.SEARCH.REPSHARE / SECOND_ORDER: expected True or False, "
                         f"got {search.REPSHARE!r} / {search.SECOND_ORDER!r}")
    if not 0.0 < search.ARCH_SPLIT < 1.0:
        raise ValueError(f"MODEL.FAD.SEARCH.ARCH_SPLIT: {search.ARCH_SPLIT} is outside (0, 1)")
    if search.GENOTYPE_PERIOD < 1 or search.NUM_CELLS < 1:
        raise ValueError(f"MODEL.FAD.SEARCH.GENOTYPE_PERIOD / NUM_CELLS: expected >= 1, got "
                         f"{search.GENOTYPE_PERIOD} / {search.NUM_CELLS}")
    if solver.ARCH_BASE_LR <= 0 or solver.ARCH_WEIGHT_DECAY < 0 or len(solver.ARCH_BETAS) != 2:
        raise ValueError(f"SOLVER.ARCH_BASE_LR / ARCH_WEIGHT_DECAY / ARCH_BETAS: expected > 0, "
                         f">= 0 and two betas, got {solver.ARCH_BASE_LR} / "
                         f"{solver.ARCH_WEIGHT_DECAY} / {solver.ARCH_BETAS}")
    return {"repshare": search.REPSHARE, "second_order": search.SECOND_ORDER,
            "arch_split": search.ARCH_SPLIT, "genotype_period": search.GENOTYPE_PERIOD,
            "num_cells": search.NUM_CELLS, "seed": search.SEED,
            "bottom_up_weights": search.BOTTOM_UP_WEIGHTS,
            "arch_lr": solver.ARCH_BASE_LR, "arch_betas": tuple(solver.ARCH_BETAS),
            "arch_weight_decay": solver.ARCH_WEIGHT_DECAY}


def search_nodes(cfg: CN) -> Dict[str, int]:
    """The supernet's nodes a cell per tower (both towers are searched)."""
    if not (cfg.MODEL.FAD.BOX_TOWER and cfg.MODEL.FAD.CLS_TOWER):
        raise ValueError("MODEL.FAD.BOX_TOWER / CLS_TOWER: the search searches both towers "
                         "(box first, classification second); set both True")
    return {"box_nodes": _positive_int(cfg, "NUM_NODES_BOX"),
            "cls_nodes": _positive_int(cfg, "NUM_NODES_CLS")}
