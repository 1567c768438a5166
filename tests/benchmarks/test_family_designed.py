"""The members as designed (benchmarks/train_quality/family_designed.py): FAD's two cells a
tower and NAS-FCOS's deformable convs build with the parameter counts the family table
states, each row changes one thing, the separable variant matches the DCN model's
parameters, random NAS-FCOS genotypes are drawn from the whole space."""
from detectron2.modeling import build_model

from benchmarks.train_quality import catalog, family
from benchmarks.train_quality import family_designed as designed
from fcos_d2.modeling.layers import DeformConv2d

# Parameters of the full models (ResNet-18 trunk included) as configs/NAS-FCOS/README.md
# and configs/FAD/README.md state them beside the table
# on the recipe's res2-res4 trunk; head 1.50 M (one cell: 0.76 M)
FAD_PAPER_TWO_CELL_PARAMS = 4_788_174
FAD_SEARCHED_TRAINED_PARAMS = 5_500_110  # head 2.22 M: the search picked deeper operations
FAD_SEARCHED_EMA09_PARAMS = 5_876_686  # head 2.59 M: the search as its config now is
NAS_DCN_PARAMS = 15_295_536  # FPN 2.94 M, head 1.18 M, 16 DCNs


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _model(name: str, *opts):
    return build_model(catalog.contender_cfg(name, 0, "unused", list(opts)))


def test_the_two_cell_fad_row_builds_two_cells_a_tower_with_the_stated_parameters():
    model = _model(designed.FAD_PAPER_TWO)
    assert len(model.head.box_tower.cells) == len(model.head.cls_tower.cells) == 2
    assert _params(model) == FAD_PAPER_TWO_CELL_PARAMS
    one_cell = catalog.contender_cfg(family.FAD_PAPER, 0, "unused")
    two_cell = catalog.contender_cfg(designed.FAD_PAPER_TWO, 0, "unused")
    differ = {k for k in two_cell.MODEL.FAD if two_cell.MODEL.FAD[k] != one_cell.MODEL.FAD[k]}
    assert differ == {"NUM_CELLS_BOX", "NUM_CELLS_CLS"}  # one thing: the cells


def test_the_searched_fad_rows_build_their_genotype_files_two_cells_a_tower():
    from fcos_d2.modeling.fad.config import fad_genotypes
    from fcos_d2.modeling.fad.genotypes import read_genotype_file

    params = {}
    for name, file in ((designed.FAD_SEARCHED_TWO, family.FAD_SEARCHED_FILE),
                       (designed.FAD_SEARCHED_TRAINED_TWO, designed.FAD_SEARCHED_TRAINED_FILE),
                       (designed.FAD_SEARCHED_EMA09_TWO, designed.FAD_SEARCHED_EMA09_FILE)):
        cfg = catalog.contender_cfg(name, 0, "unused")
        box, cls = read_genotype_file(family.GENOTYPES / file)
        assert fad_genotypes(cfg) == {"box": box, "cls": cls}, name
        model = build_model(cfg)
        assert len(model.head.box_tower.cells) == len(model.head.cls_tower.cells) == 2, name
        params[name] = _params(model)
    assert params[designed.FAD_SEARCHED_TRAINED_TWO] == FAD_SEARCHED_TRAINED_PARAMS
    assert params[designed.FAD_SEARCHED_EMA09_TWO] == FAD_SEARCHED_EMA09_PARAMS


def test_the_dcn_nas_fcos_row_builds_its_16_deformable_convs_with_the_stated_parameters():
    for name in (family.NAS_HEAD_DCN, designed.NAS_HEAD_DCN_CTR_CLS):  # issue 50's, on the recipe
        model = _model(name)
        assert sum(isinstance(m, DeformConv2d) for m in model.modules()) == 16
        assert _params(model) == NAS_DCN_PARAMS


def test_designed_rows_train_on_the_recipe_solver_at_their_levels():
    recipe = catalog.contender_cfg(family.FCOS_HEAD, 0, "unused")
    p3_p7 = catalog.contender_cfg(designed.FCOS_P3_P7, 0, "unused")
    for name in (designed.FAD_PAPER_TWO, *designed.MAIN_ROWS[:-1], "nas-fcos random-1 dcn"):
        cfg = catalog.contender_cfg(name, 0, "unused")
        assert cfg.SOLVER.OPTIMIZER == recipe.SOLVER.OPTIMIZER == "ADAMW", name
        assert cfg.SOLVER.AMP.ENABLED and cfg.SOLVER.BASE_LR == recipe.SOLVER.BASE_LR, name
        levels = recipe if name == designed.FAD_PAPER_TWO else p3_p7
        assert cfg.MODEL.FCOS.IN_FEATURES == levels.MODEL.FCOS.IN_FEATURES, name
        assert cfg.MODEL.FCOS.SIZES_OF_INTEREST == levels.MODEL.FCOS.SIZES_OF_INTEREST, name
    old = catalog.contender_cfg(family.NAS_HEAD_DCN, 0, "unused")  # issue 50's protocol
    assert old.SOLVER.OPTIMIZER == "SGD" and not old.SOLVER.AMP.ENABLED


def test_the_centerness_row_changes_only_the_centerness_placement():
    authors = catalog.contender_cfg(designed.NAS_HEAD_DCN_CTR_CLS, 0, "unused")
    on_reg = catalog.contender_cfg(designed.NAS_HEAD_DCN_CTR_REG, 0, "unused")
    assert on_reg.MODEL.NAS_FCOS.CENTERNESS_ON_REG and not authors.MODEL.NAS_FCOS.CENTERNESS_ON_REG
    on_reg.defrost()
    on_reg.MODEL.NAS_FCOS.CENTERNESS_ON_REG = False
    assert on_reg == authors
    fpn_only = catalog.contender_cfg(designed.NAS_FPN_DCN, 0, "unused")
    assert fpn_only.MODEL.NAS_FCOS.FPN_GENOTYPE == authors.MODEL.NAS_FCOS.FPN_GENOTYPE
    assert fpn_only.MODEL.NAS_FCOS.HEAD_GENOTYPE == []  # FCOS's head


def test_the_separable_variant_has_the_nearest_parameters_to_the_dcn_model():
    def sep(channels):
        return _params(_model(designed.NAS_SEP_MATCHED, "MODEL.NAS_FCOS.CHANNELS", channels))

    matched = sep(designed.SEP_MATCHED_CHANNELS)
    assert not any(isinstance(m, DeformConv2d) for m in _model(designed.NAS_SEP_MATCHED).modules())
    assert abs(matched - NAS_DCN_PARAMS) / NAS_DCN_PARAMS < 0.02
    for other in (designed.SEP_MATCHED_CHANNELS - 32, designed.SEP_MATCHED_CHANNELS + 32):
        assert abs(sep(other) - NAS_DCN_PARAMS) > abs(matched - NAS_DCN_PARAMS)


def test_random_nas_genotypes_are_seeded_distinct_and_build():
    first, again, second = (designed.nas_random_genotype(s) for s in (1, 1, 2))
    assert first == again and first != second
    cfg = catalog.contender_cfg("nas-fcos random-1 dcn", 0, "unused",
                                ["MODEL.NAS_FCOS.CHANNELS", 32])
    assert cfg.MODEL.NAS_FCOS.FPN_GENOTYPE == first[0]
    assert cfg.MODEL.NAS_FCOS.HEAD_GENOTYPE == first[1]
    assert build_model(cfg).__class__.__name__ == "NASFCOS"


def test_designed_rows_are_by_name_only_and_every_comparison_names_known_rows():
    names = catalog.contender_names()
    assert set(designed.DESIGNED_ORDER) <= set(names)
    assert not set(catalog.default_contenders(names, "shapes")) & set(designed.DESIGNED_ORDER)
    assert catalog.designed_names() == [family.FCOS_HEAD, designed.FCOS_P3_P7, *designed.MAIN_ROWS]
    for searched, randoms in designed.SEARCH_COMPARISONS.items():
        assert searched in names and len(randoms) == 4 and set(randoms) <= set(names)
    # the proxy check's >= 8 architectures a space: searched, published and random rows
    assert len(designed.NAS_RANDOM_DCN) == len(designed.FAD_RANDOM_TWO) == 6


def test_the_offset_lr_rows_change_only_the_offsets_lr():
    for base, slow in designed.OFFSET_LR_ROWS.items():
        before = catalog.contender_cfg(base, 0, "unused")
        after = catalog.contender_cfg(slow, 0, "unused")
        assert before.SOLVER.DEFORM_OFFSET_LR_FACTOR == 1.0, base
        assert after.SOLVER.DEFORM_OFFSET_LR_FACTOR == 0.1, slow
        after.defrost()
        after.SOLVER.DEFORM_OFFSET_LR_FACTOR = 1.0
        assert after == before, slow
    # the rows that draw DCNs from the search's space take the slower offsets too
    for name in (designed.NAS_SEARCHED_DCN, "nas-fcos random-1 dcn"):
        assert catalog.contender_cfg(name, 0, "unused").SOLVER.DEFORM_OFFSET_LR_FACTOR == 0.1


def test_a_base_row_run_with_the_offset_lr_on_its_command_line_counts_as_the_offset_lr_row():
    schedule = ["SOLVER.MAX_ITER", "4200", "SOLVER.STEPS", "(3500,)"]
    factor = [str(v) for v in designed.OFFSET_LR]  # as a record stores the command line

    def record(name, overrides):
        return {"overrides": overrides, "run": {"contender": name}}

    for base, slow in designed.OFFSET_LR_ROWS.items():
        # the same config, so that the pilot's AP is the row's
        assert catalog.contender_cfg(base, 0, "unused", factor) == \
            catalog.contender_cfg(slow, 0, "unused"), base
        assert designed.counted_as(record(base, schedule + factor)) == (slow, ())
        other = ["SOLVER.DEFORM_OFFSET_LR_FACTOR", "0.2"]
        assert designed.counted_as(record(base, schedule + other)) == (base, tuple(other))
        assert designed.counted_as(record(base, schedule)) == (base, ())
    published = designed.NAS_HEAD_DCN_CTR_CLS  # another row with the factor stays itself
    assert designed.counted_as(record(designed.FCOS_P3_P7, factor)) == \
        (designed.FCOS_P3_P7, tuple(factor))
    assert designed.counted_as(record(designed.OFFSET_LR_ROWS[published], schedule)) == \
        (designed.OFFSET_LR_ROWS[published], ())


def test_the_equal_flops_row_is_the_widest_published_model_within_the_tolerance():
    from benchmarks.family_tables import EQUAL_FLOPS_TOLERANCE
    import torch

    from benchmarks.train_quality.family_costs import gflops

    image = [{"image": torch.zeros(3, 128, 128), "height": 128, "width": 128}]  # the shapes'

    def flops(name, *opts):
        return gflops(_model(name, *opts).eval(), image)

    fcos = flops(designed.FCOS_P3_P7)
    assert flops(designed.NAS_EQUAL_FLOPS) <= EQUAL_FLOPS_TOLERANCE * fcos
    wider = designed.EQUAL_FLOPS_CHANNELS + 32  # the next width GroupNorm(32) divides
    assert flops(designed.NAS_EQUAL_FLOPS, "MODEL.NAS_FCOS.CHANNELS", wider) > \
        EQUAL_FLOPS_TOLERANCE * fcos
    published = catalog.contender_cfg(designed.OFFSET_LR_ROWS[designed.NAS_HEAD_DCN_CTR_CLS],
                                      0, "unused")
    narrow = catalog.contender_cfg(designed.NAS_EQUAL_FLOPS, 0, "unused")
    narrow.defrost()
    narrow.MODEL.NAS_FCOS.CHANNELS = published.MODEL.NAS_FCOS.CHANNELS
    assert narrow == published  # one thing: the width


def test_a_contenders_gflops_are_the_cost_benchmarks_count():
    from benchmarks.train_quality import family_costs

    name = designed.FCOS_P3_P7
    import torch

    counted, threads = family_costs.contender_gflops(name), torch.get_num_threads()
    try:
        measured = family_costs.measure([name], runs=1, threads=1)[name]["gflops"]
    finally:
        torch.set_num_threads(threads)
    assert counted == measured == family_costs.contender_gflops(name)  # registered once
    assert 0.9 < measured < 1.2  # 1.060 in the cost records (family_costs.jsonl)
