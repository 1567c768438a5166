"""The family's contenders of the training-quality benchmark (benchmarks/train_quality/
family.py): NAS-FCOS and FAD on the recipe's trunk with only their FPN or head changed,
searched genotypes read from files, deformable convs replaced on the CPU, RetinaNet on the
same trunk; the genotype file writer; the cost records; the family table and its block in
the member READMEs."""
import json

import pytest
import torch
from detectron2.modeling import build_model

from benchmarks import family_tables, table_cells, tables
from benchmarks.train_quality import catalog, family, family_costs, family_designed

SMALL = ["MODEL.FPN.OUT_CHANNELS", 32, "MODEL.FCOS.NUM_CONVS", 1]


def _trunk(model) -> dict:
    bottom_up = getattr(model.backbone, "bottom_up", model.backbone)
    return {k: tuple(v.shape) for k, v in bottom_up.state_dict().items()
            if k.startswith(("stem", "res"))}


def test_the_family_names_are_the_references_and_every_member_row_without_the_dcn_one():
    names = catalog.family_names()
    assert names[:2] == ["fcos-d2 recipe", "detectron2 faster-rcnn"]
    assert family.NAS_HEAD_DCN not in names  # by name only: hours on a CPU
    assert set(names) == set(family.FAMILY_ORDER) - {family.NAS_HEAD_DCN}
    # not in "all": the measured table of --contenders all stays what it was
    assert not set(catalog.default_contenders(catalog.contender_names(), "shapes")) \
        & set(family.FAMILY_ORDER[2:])


def test_nas_fcos_rows_change_the_fpn_and_head_only():
    # the family rows keep the recipe's protocol before issue 60 (P3-P7, SGD, float32)
    recipe = catalog.contender_cfg("fcos-d2 recipe+before-issue-60", 0, "unused")
    fpn = catalog.contender_cfg(family.NAS_FPN, 0, "unused")
    head = catalog.contender_cfg(family.NAS_HEAD, 0, "unused")
    assert fpn.MODEL.META_ARCHITECTURE == head.MODEL.META_ARCHITECTURE == "NASFCOS"
    assert fpn.MODEL.NAS_FCOS.HEAD_GENOTYPE == []  # FCOS's head on the searched FPN
    assert head.MODEL.NAS_FCOS.HEAD_GENOTYPE == family.CPU_HEAD_GENOTYPE
    assert fpn.MODEL.NAS_FCOS.CHANNELS == recipe.MODEL.FPN.OUT_CHANNELS == 128
    for key in ("DATASETS", "SOLVER", "INPUT", "SEED"):
        assert fpn[key] == recipe[key], key
    # the recipe's FCOS formulation, not the published one: rows differ by FPN and head
    differ = {k for k in recipe.MODEL.FCOS if fpn.MODEL.FCOS[k] != recipe.MODEL.FCOS[k]}
    assert differ <= {"TOP_BLOCKS_IN", "CHANNELS_LAST"}


def test_without_dcn_replaces_every_deformable_conv_and_nothing_else():
    fpn = [[3, 2, "def_conv_3x3", "skip_connect", "psum"], [4, 0, "sep_conv_3x3", "def_conv_3x3", "cat"]]
    head = ["def_conv_3x3", "conv1x1", "skip_connect"]
    assert family.without_dcn(fpn, head) == (
        [[3, 2, "sep_conv_3x3", "skip_connect", "psum"], [4, 0, "sep_conv_3x3", "sep_conv_3x3", "cat"]],
        ["sep_conv_3x3", "conv1x1", "skip_connect"])


def test_a_searched_row_trains_its_files_genotype_without_dcn(tmp_path, monkeypatch):
    genotype = {"FPN_GENOTYPE": [list(c) for c in family.CPU_FPN_GENOTYPE],
                "HEAD_GENOTYPE": ["def_conv_3x3", "conv1x1", "conv3x3", "skip_connect",
                                  "conv1x1", "conv3x3"], "HEAD_SHARE_INDEX": 2}
    (tmp_path / "g.yaml").write_text(json.dumps(genotype))  # YAML reads JSON
    monkeypatch.setattr(family, "GENOTYPES", tmp_path)
    cfg = family.NASFCOSContender("x", genotype_file="g.yaml").config(0, "unused")
    assert cfg.MODEL.NAS_FCOS.HEAD_GENOTYPE == ["sep_conv_3x3", "conv1x1", "conv3x3",
                                                "skip_connect", "conv1x1", "conv3x3"]
    assert cfg.MODEL.NAS_FCOS.HEAD_SHARE_INDEX == 2
    with pytest.raises(FileNotFoundError, match="missing.yaml: no such genotype file"):
        family.NASFCOSContender("y", genotype_file="missing.yaml").config(0, "unused")
    (tmp_path / "bad.yaml").write_text("FPN_GENOTYPE: []\n")
    with pytest.raises(KeyError, match=r"bad.yaml: missing keys \['HEAD_GENOTYPE'"):
        family.NASFCOSContender("z", genotype_file="bad.yaml").config(0, "unused")


def test_the_committed_genotypes_build():
    for name in [*family.NAS_GENOTYPE_FILES, family.FAD_SEARCHED]:
        cfg = catalog.contender_cfg(name, 0, "unused", SMALL)
        assert build_model(cfg).__class__.__name__ == ("FAD" if "fad" in name else "NASFCOS")


def test_fad_rows_differ_by_genotype_only():
    paper = catalog.contender_cfg(family.FAD_PAPER, 0, "unused")
    random_1 = catalog.contender_cfg("fad random-1", 0, "unused")
    random_2 = catalog.contender_cfg("fad random-2", 0, "unused")
    assert paper.MODEL.META_ARCHITECTURE == "FAD" and paper.MODEL.FAD.NUM_CHANNELS_BOX == 64
    assert len({str(c.MODEL.FAD.GENO_BOX) for c in (paper, random_1, random_2)}) == 3
    assert paper.MODEL.FAD.NUM_CELLS_BOX == random_1.MODEL.FAD.NUM_CELLS_BOX == 1


def test_retinanet_is_detectron2s_on_the_recipes_trunk_with_halved_anchors():
    from detectron2.modeling.meta_arch import RetinaNet

    cfg = catalog.contender_cfg(family.RETINANET, 0, "unused", SMALL)
    former = catalog.contender_cfg("fcos-d2 recipe+before-issue-60", 0, "unused", SMALL)
    model, recipe = build_model(cfg), build_model(former)
    assert isinstance(model, RetinaNet) and cfg.MODEL.RETINANET.NUM_CLASSES == 6
    assert _trunk(model) == _trunk(recipe)
    assert [round(s[0]) for s in cfg.MODEL.ANCHOR_GENERATOR.SIZES] == [16, 32, 64, 128, 256]
    assert cfg.MODEL.RETINANET.IN_FEATURES == ["p3", "p4", "p5", "p6", "p7"]


def test_a_genotype_file_is_written_from_a_searchs_records(tmp_path, monkeypatch):
    records = [{"phase": "fpn", "sample": 0, "reward": -2.0, "genotype": {"FPN_GENOTYPE": [[0]]}},
               {"phase": "fpn", "sample": 1, "reward": -1.5, "genotype": {"FPN_GENOTYPE": [[1]]}},
               {"phase": "head", "sample": 0, "reward": -1.8,
                "genotype": {"HEAD_GENOTYPE": ["conv1x1"], "HEAD_SHARE_INDEX": 3}}]
    (tmp_path / "search_records.json").write_text(json.dumps(records))
    monkeypatch.setattr(family, "GENOTYPES", tmp_path)
    family.main(["--records", str(tmp_path / "search_records.json"), "--fpn-sample", "1",
                 "--head-sample", "0", "--name", "g", "--source", "a search"])
    text = (tmp_path / "g.yaml").read_text()
    assert "#   a search" in text.splitlines()[1]
    assert family.read_nas_genotype(tmp_path / "g.yaml") == {
        "FPN_GENOTYPE": [[1]], "HEAD_GENOTYPE": ["conv1x1"], "HEAD_SHARE_INDEX": 3,
        "fpn_reward": -1.5, "head_reward": -1.8}
    with pytest.raises(KeyError, match="no head sample 5"):
        family.nas_genotype_of_search(tmp_path / "search_records.json", 0, 5)


def test_cost_records_hold_each_contenders_params_gflops_and_latency():
    model = torch.nn.Conv2d(3, 4, 1)
    assert family_costs.timed_inference({"m": lambda x: model(x)}, torch.zeros(1, 3, 2, 2), 2)["m"] > 0
    costs = {"a": {"params_M": 1.0, "gflops": 2.0, "latency_ms": 3.0}}
    (record,) = family_costs.cost_records(costs, 5, 1, "cmd")
    assert record["benchmark"] == "family_costs" and record["metrics"] == costs["a"]
    assert record["run"] == {"contender": "a", "runs": 5, "threads": 1}
    assert family_costs.costs_table(costs).splitlines()[-1] == "| a | 1.00 | 2.000 | 3.0 |"


def _record(benchmark, seed, metrics, times, run):
    return {"benchmark": benchmark, "date": "d", "commit": "b" * 40, "dirty": False,
            "cpu": {"model": "CPU", "flags": []}, "command": "c", "seed": seed,
            "overrides": [], "metrics": metrics, "times": times, "run": run}


def test_the_family_table_joins_ap_over_seeds_with_the_latest_costs(tmp_path):
    quality = [_record("train_quality", s, {"AP": ap, "AP50": 2 * ap},
                       {"seconds_per_iteration": 0.2}, {"contender": family.NAS_HEAD})
               for s, ap in ((0, 10.0), (1, 14.0))]
    quality.append(_record("train_quality", 0, {"AP": 99.0, "AP50": 99.0}, {},
                           {"contender": family.NAS_HEAD, "regime": "thin"}))  # not shapes
    costs = [_record("family_costs", None, {"params_M": m, "gflops": 0.5, "latency_ms": 7.0},
                     {}, {"contender": family.NAS_HEAD}) for m in (1.0, 2.0)]
    rows = family_tables.family_rows(list(enumerate(quality, 1)), list(enumerate(costs, 1)))
    assert rows == [[family.NAS_HEAD, "0, 1", "12.0 / 2.8", "10.0-14.0", "24.0", "0.200", "",
                     "2.00", "0.500", "7.0", "no FCOS row with costs", "bbbbbbb", "CPU",
                     "1, 2; 2"]]


def test_the_family_block_of_a_readme_is_replaced_and_a_missing_marker_named(tmp_path):
    path = tmp_path / "README.md"
    text = f"intro\n{family_tables.BEGIN}\nold\n{family_tables.END}\nafter\n"
    assert family_tables.embedded(text, ["| a |"], path) == \
        f"intro\n{family_tables.BEGIN}\n| a |\n{family_tables.END}\nafter\n"
    with pytest.raises(ValueError, match="README.md: expected one"):
        family_tables.embedded("no markers", ["| a |"], path)


def test_the_command_writes_the_family_doc_and_check_tells_it_stale(tmp_path):
    quality = _record("train_quality", 0, {"AP": 5.0, "AP50": 9.0}, {},
                      {"contender": family.FAD_PAPER})
    costs = _record("family_costs", None, {"params_M": 1.0, "gflops": 0.5, "latency_ms": 7.0},
                    {}, {"contender": family.FAD_PAPER})
    for name, record in (("train_quality", quality), ("family_costs", costs)):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(record) + "\n")
    argv = ["--records", str(tmp_path), "--docs", str(tmp_path / "docs")]
    assert tables.main(argv) == 0
    doc = (tmp_path / "docs" / "family.md").read_text()
    assert f"| {family.FAD_PAPER} | 0 | 5.0 / n/a |" in doc
    assert tables.main(argv + ["--check"]) == 0
    (tmp_path / "docs" / "family.md").write_text("edited")
    assert tables.main(argv + ["--check"]) == 1


def test_a_run_without_any_detection_counts_as_zero_ap_and_is_named():
    quality = [_record("train_quality", s, {"AP": ap, "AP50": ap}, {}, {"contender": family.RETINANET})
               for s, ap in ((0, 3.0), (2, float("nan")))]  # COCOEvaluator: NaN, no detection
    (row,) = family_tables.family_rows(list(enumerate(quality, 1)), [])
    assert row[0] == f"{family.RETINANET} (no detection with seed 2: AP 0)"
    assert row[2:5] == ["1.5 / 2.1", "0.0-3.0", "1.5"]


def test_a_contender_with_costs_but_no_run_gets_its_costs_alone():
    costs = [_record("family_costs", None, {"params_M": 1.0, "gflops": 0.5, "latency_ms": 7.0},
                     {}, {"contender": family.NAS_HEAD_DCN})]
    (row,) = family_tables.family_rows([], list(enumerate(costs, 1)))
    assert row[0] == f"{family.NAS_HEAD_DCN} (not trained)" and row[1:7] == [""] * 6
    assert row[7:10] == ["1.00", "0.500", "7.0"] and row[-1] == "; 1"
    longer = {**_record("train_quality", 0, {"AP": 5.0, "AP50": 5.0}, {},
                        {"contender": family.NAS_HEAD_DCN, "iterations": 4200}),
              "overrides": ["SOLVER.MAX_ITER", "4200"]}
    # trained at another schedule: that schedule's table has it, this one leaves it out
    assert family_tables.family_rows([(1, longer)], list(enumerate(costs, 1))) == []
    (row,) = family_tables.family_rows([(1, longer)], list(enumerate(costs, 1)), 4200)
    assert row[0] == family.NAS_HEAD_DCN and row[2] == "5.0 / n/a"


def test_a_designed_row_never_trained_is_listed_in_the_longest_schedules_table():
    name = family_designed.FAD_SEARCHED_EMA09_TWO
    costs = [(1, _record("family_costs", None, {"params_M": 1.0, "gflops": 0.5, "latency_ms": 7.0},
                         {}, {"contender": name}))]
    runs = [(n, {**_record("train_quality", 0, {"AP": 5.0, "AP50": 5.0}, {},
                           {"contender": family.FAD_PAPER, "iterations": it}),
                 "overrides": ["SOLVER.MAX_ITER", str(it)]}) for n, it in ((1, 1400), (2, 4200))]
    def rows_of(iterations):
        return [r for r in family_tables.family_rows(runs, costs, iterations)
                if r[0].startswith(name)]

    assert rows_of(None) == [] and rows_of(1400) == []
    (row,) = rows_of(4200)
    assert row[0] == f"{name} (not trained)" and row[7:10] == ["1.00", "0.500", "7.0"]
    # without a longer schedule, the protocol's table is where it shows
    (row,) = family_tables.family_rows([], costs)
    assert row[0] == f"{name} (not trained)"


def test_equal_flops_reading_compares_ap_only_up_to_the_tolerance():
    assert family_tables.equal_flops_reading(6.0, 1.05, 5.5, 1.0) == \
        "1.05x FCOS's GFLOPs, +0.5 AP: reaches FCOS's AP"
    assert family_tables.equal_flops_reading(5.0, 0.5, 5.5, 1.0) == \
        "0.50x FCOS's GFLOPs, -0.5 AP: below FCOS's AP"
    assert family_tables.equal_flops_reading(9.0, 1.2, 5.5, 1.0) == \
        "1.20x FCOS's GFLOPs: no equal-FLOPs reading"
    assert family_tables.equal_flops_reading(9.0, 1.0, None, None) == "no FCOS row with costs"
    assert family_tables.equal_flops_reading(5.0, 1.2, 5.5, 1.0) == \
        "1.20x FCOS's GFLOPs, -0.5 AP: below FCOS's AP at more FLOPs"


def test_a_longer_schedule_gets_its_own_table_with_training_seconds_and_the_reading(tmp_path):
    schedule = ["SOLVER.MAX_ITER", "4800", "SOLVER.STEPS", "(4000,)"]

    def run(name, seed, ap, seconds, overrides):
        record = _record("train_quality", seed, {"AP": ap, "AP50": ap},
                         {"seconds_per_iteration": seconds / 4800, "train_seconds": seconds},
                         {"contender": name, "iterations": 4800 if overrides else 600})
        return {**record, "overrides": overrides}

    quality = [run(family.FCOS_HEAD, 0, 20.0, 1000.0, schedule),
               run(family.FAD_PAPER, 0, 21.0, 1200.0, schedule),
               run(family.FAD_PAPER, 1, 23.0, 1400.0, schedule),
               run(family.FAD_PAPER, 0, 5.0, 200.0, []),
               run(family.FAD_PAPER, 2, 99.0, 1.0, ["MODEL.FCOS.PRIOR_PROB", "0.1"])]
    costs = [_record("family_costs", None, {"params_M": 1.0, "gflops": g, "latency_ms": 7.0}, {},
                     {"contender": name}) for name, g in ((family.FCOS_HEAD, 1.0),
                                                          (family.FAD_PAPER, 0.9))]
    numbered = list(enumerate(quality, 1))
    assert family_tables.longer_schedules(numbered) == [4800]
    fcos, fad = family_tables.family_rows(numbered, list(enumerate(costs, 1)), 4800)
    assert fcos[0] == family.FCOS_HEAD and fcos[10] == "the reference"
    assert fad[1:3] == ["0, 1", "22.0 / 1.4"] and fad[6] == "1300"  # not the other runs
    assert fad[10] == "0.90x FCOS's GFLOPs, +2.0 AP: reaches FCOS's AP"
    for name, records in (("train_quality", quality), ("family_costs", costs)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    doc = family_tables.family_doc(tmp_path)
    assert "## At 4800 iterations" in doc and doc.count("| contender |") == 2


def test_nas_fcos_designed_rows_read_against_fcos_on_their_levels_with_costs_of_their_era():
    from benchmarks.train_quality import family_designed as designed

    schedule = ["SOLVER.MAX_ITER", "4200"]

    def run(name, ap, recipe=True):
        record = {**_record("train_quality", 0, {"AP": ap, "AP50": ap}, {},
                            {"contender": name, "iterations": 4200}), "overrides": schedule}
        return {**record, "recipe": "abcd1234"} if recipe else record

    def cost(name, gflops, recipe):
        record = _record("family_costs", None, {"params_M": 1.0, "gflops": gflops,
                                                "latency_ms": 7.0}, {}, {"contender": name})
        return {**record, "recipe": "abcd1234"} if recipe else record

    quality = [run(family.FCOS_HEAD, 60.0), run(designed.FCOS_P3_P7, 40.0),
               run(designed.NAS_HEAD_DCN_CTR_CLS, 41.0), run(designed.FAD_PAPER_TWO, 61.0)]
    costs = [cost(family.FCOS_HEAD, 1.0, True), cost(family.FCOS_HEAD, 9.0, False),
             cost(designed.FCOS_P3_P7, 2.0, True), cost(designed.NAS_HEAD_DCN_CTR_CLS, 2.1, True),
             cost(designed.FAD_PAPER_TWO, 1.05, True)]
    fcos, p3_p7, nas, fad = family_tables.family_rows(
        list(enumerate(quality, 1)), list(enumerate(costs, 1)), 4200)
    assert fcos[8] == "1.000"  # the digested cost, not the later one of the old era
    assert p3_p7[10] == "the reference of NAS-FCOS's designed rows"
    assert nas[10] == "1.05x FCOS's GFLOPs, +1.0 AP: reaches FCOS's AP"  # against P3-P7's
    assert fad[10] == "1.05x FCOS's GFLOPs, +1.0 AP: reaches FCOS's AP"  # against the recipe
    legacy = family_tables.family_rows([(1, run(family.FCOS_HEAD, 5.0, recipe=False))],
                                       list(enumerate(costs, 1)), 4200)
    assert legacy[0][8] == "9.000"  # runs without a digest: the cost without one


def test_seeds_from_a_cpu_without_native_bf16_are_marked_where_the_table_mixes_kinds():
    def run(seed, flags, contender=family.NAS_HEAD):
        record = _record("train_quality", seed, {"AP": 10.0, "AP50": 20.0}, {},
                         {"contender": contender})
        return {**record, "cpu": {"model": "CPU", "flags": flags}}

    native = [run(0, ["avx512_bf16"]), run(1, ["amx_bf16", "amx_tile"])]
    (row,) = family_tables.family_rows(list(enumerate(native, 1)), [])
    assert row[1] == "0, 1"  # one kind: no mark
    mixed = native + [run(2, []), run(0, [], family.FAD_PAPER)]  # AVX2 only: no bf16 flag
    rows = family_tables.family_rows(list(enumerate(mixed, 1)), [])
    assert [r[1] for r in rows] == ["0, 1, 2*", "0*"]  # the other row marked as well
    lines = family_tables.family_table(list(enumerate(mixed, 1)), [])
    assert lines[-2:] == ["", table_cells.NO_BF16_NOTE]
    assert table_cells.NO_BF16_NOTE.startswith("* trained on a CPU without native bf16")
    assert not family_tables.family_table(list(enumerate(native, 1)), [])[-1].startswith("*")
