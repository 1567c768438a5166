"""The FAD model: its configs build, its head keeps FCOSHead's output contract, and every
MODEL.FAD key is checked by name."""
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.layers import ShapeSpec

from fcos_d2 import add_fcos_config
from fcos_d2.modeling.fad import FAD, FADSearch, PAPER_BOX, PAPER_CLS, write_genotype_file
from fcos_d2.modeling.fad.cells import DerivedTower
from fcos_d2.modeling.fad.head import FADHead
from fcos_d2.modeling.meta_arch import FCOS

LEVELS = [ShapeSpec(channels=64, stride=s) for s in (8, 16)]


def config(name="FAD-tiny-train.yaml", *opts):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(f"configs/FAD/{name}")
    cfg.merge_from_list(list(opts))
    return cfg


@pytest.mark.parametrize("name, channels, meta", [
    ("FAD-R50-1x.yaml", 96, "FAD"), ("FAD-R101-2x-MS.yaml", 96, "FAD"),
    ("FAD-X101-64x4d-2x-MS.yaml", 128, "FAD"), ("FAD-R50-search.yaml", 96, "FADSearch"),
    ("FAD-tiny-train.yaml", 32, "FAD"), ("FAD-tiny-search.yaml", 32, "FADSearch"),
    ("FAD-search-on-recipe.yaml", 64, "FADSearch"), ("FAD-search-P2-P4.yaml", 64, "FADSearch")])
def test_configs_build_their_head(name, channels, meta):
    cfg = config(name)
    assert cfg.MODEL.META_ARCHITECTURE == meta
    assert cfg.MODEL.FAD.NUM_CHANNELS_BOX == cfg.MODEL.FAD.NUM_CHANNELS_CLS == channels
    arch = {"FAD": FAD, "FADSearch": FADSearch}[meta]
    assert issubclass(arch, FCOS)  # reuses FCOS's assignment, losses and detections
    shapes = [ShapeSpec(channels=cfg.MODEL.FPN.OUT_CHANNELS, stride=8)]
    head = arch.build_head(cfg, shapes)
    assert head.box_tower.cells[0].dag[0][0].reduce.out_channels == channels


def test_augment_configs_default_to_the_paper_genotypes_and_fcos_imprv():
    cfg = config("FAD-R50-1x.yaml")
    head = FAD.build_head(cfg, [ShapeSpec(channels=256, stride=8)])
    assert len(head.box_tower.cells) == len(head.cls_tower.cells) == 2
    assert head.box_tower.cells[0].sources == [[0, 1], [2, 1], [2, 3]]  # PAPER_BOX
    fcos = cfg.MODEL.FCOS
    assert (fcos.LOC_LOSS_TYPE, fcos.CENTER_SAMPLING_RADIUS, fcos.NORM_REG_TARGETS) == \
        ("giou", 1.5, True)


def test_head_output_contract_and_the_second_cells_preprocessing():
    head = FADHead(config("FAD-tiny-train.yaml", "MODEL.FAD.NUM_CELLS_BOX", "2"), LEVELS)
    features = [torch.randn(2, 64, 8, 8), torch.randn(2, 64, 4, 4)]
    logits, regression, centerness = head(features)
    assert [x.shape for x in logits] == [(2, 6, 8, 8), (2, 6, 4, 4)]
    assert [x.shape for x in regression] == [(2, 4, 8, 8), (2, 4, 4, 4)]
    assert [x.shape for x in centerness] == [(2, 1, 8, 8), (2, 1, 4, 4)]
    assert all((x >= 0).all() for x in regression)  # ReLU on stride units
    second = head.box_tower.cells[1]
    assert isinstance(second.preprocess[0], torch.nn.Identity)  # the tower's input, 64
    assert second.preprocess[1][0].in_channels == 3 * 64  # the first cell's concatenation
    assert head.box_reduce.in_channels == 3 * 64 and head.box_reduce.out_channels == 64


def test_tower_switch_keeps_fcos_plain_tower():
    cfg = config("FAD-tiny-train.yaml", "MODEL.FAD.CLS_TOWER", "False")
    head = FADHead(cfg, LEVELS)
    assert isinstance(head.box_tower, DerivedTower)
    assert isinstance(head.cls_tower, torch.nn.Sequential)
    assert len(head.cls_tower) == 3 * cfg.MODEL.FCOS.NUM_CONVS


def test_genotype_file_key_replaces_the_config_genotypes(tmp_path):
    path = tmp_path / "genotype.log"
    write_genotype_file(path, PAPER_CLS, PAPER_BOX)  # swapped on purpose
    head = FADHead(config("FAD-tiny-train.yaml", "MODEL.FAD.GENOTYPE_FILE", str(path)), LEVELS)
    assert head.box_tower.cells[0].sources == [[1, 0], [0, 2], [2, 3]]  # PAPER_CLS


@pytest.mark.parametrize("opts, message", [
    (["MODEL.FAD.NUM_CHANNELS_BOX", "48"], "MODEL.FAD.NUM_CHANNELS_BOX: 48 is not a multiple of 32"),
    (["MODEL.FAD.NUM_NODES_CLS", "4"], "MODEL.FAD.NUM_NODES_CLS: 4, but the cls genotype has 3"),
    (["MODEL.FAD.NUM_CELLS_CLS", "0"], "MODEL.FAD.NUM_CELLS_CLS: expected an integer >= 1"),
    (["MODEL.FAD.BOX_TOWER", "1"], "config key: MODEL.FAD.BOX_TOWER"),  # yacs's type check
    (["MODEL.FAD.GENO_BOX", "[[['sep_conv_3x3', 0]]]"],
     "MODEL.FAD.GENO_BOX: node 0: unknown operation 'sep_conv_3x3'"),
    (["MODEL.FAD.GENOTYPE_FILE", "/nonexistent/genotype.log"], "MODEL.FAD.GENOTYPE_FILE: no file"),
])
def test_bad_values_are_refused_naming_the_key(opts, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        FADHead(config("FAD-tiny-train.yaml", *opts), LEVELS)


@pytest.mark.parametrize("opts, message", [
    (["MODEL.FAD.SEARCH.ARCH_SPLIT", "1.0"], r"MODEL.FAD.SEARCH.ARCH_SPLIT: 1.0 is outside \(0, 1\)"),
    (["SOLVER.ARCH_BASE_LR", "0.0"], "SOLVER.ARCH_BASE_LR"),
    (["MODEL.FAD.SEARCH.NUM_CELLS", "2"], "MODEL.FAD.SEARCH.NUM_CELLS: the search runs one cell"),
    (["MODEL.FAD.CLS_TOWER", "False"], "the search searches both towers"),
])
def test_bad_search_values_are_refused_naming_the_key(opts, message):
    with pytest.raises(ValueError, match=message):
        FADSearch.build_head(config("FAD-tiny-search.yaml", *opts), LEVELS)


def test_unknown_fad_key_is_refused():
    with pytest.raises(AssertionError, match="Non-existent key: MODEL.FAD.GENO_BOXES"):
        config("FAD-tiny-train.yaml", "MODEL.FAD.GENO_BOXES", "[]")
