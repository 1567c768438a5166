"""benchmarks.train_quality.diagnostics: a hook that records losses, positives per level,
gradient norms, BN statistics, regression outputs and the positives' scores of a run
without changing it."""
import importlib.util
import itertools

import pytest
import torch
from detectron2.engine import SimpleTrainer
from detectron2.solver.build import maybe_add_gradient_clipping
from detectron2.structures import Boxes, Instances

from benchmarks.train_quality import analyses, catalog, protocol
from benchmarks.train_quality import contenders as cn, diagnostics as diag


def test_summary_of_hand_made_values():
    stats = diag.summary(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert stats["n"] == 5 and stats["mean"] == 3.0 and stats["q50"] == 3.0
    assert stats["std"] == pytest.approx(2.5 ** 0.5, abs=1e-5)
    assert stats["q5"] == pytest.approx(1.2) and stats["q95"] == pytest.approx(4.8)
    assert diag.summary(torch.zeros(0)) is None


def test_positives_are_counted_per_level():
    labels = torch.tensor([[0, 3, 3, 1, 3, 2], [3, 3, 3, 3, 0, 3]])  # K = 3; levels of 3, 2, 1
    assert diag.labels_per_level(labels, [3, 2, 1], num_classes=3) == [1, 2, 1]


def test_positive_probabilities_are_read_at_each_positives_class():
    # one image, K = 2, two levels of 2 x 1 and 1 x 1 locations
    logits = [torch.tensor([[[[0.0], [1.0]], [[2.0], [3.0]]]]), torch.tensor([[[[4.0]], [[5.0]]]])]
    labels = torch.tensor([[1, 2, 0]])  # location 0 class 1, location 1 background, 2 class 0
    probs = diag.positive_probabilities(logits, labels, num_classes=2)
    assert probs.tolist() == pytest.approx(torch.sigmoid(torch.tensor([2.0, 4.0])).tolist())


def _batch():
    torch.manual_seed(0)
    instances = Instances((64, 64), gt_boxes=Boxes(torch.tensor([[5.0, 10, 30, 35],
                                                                   [40, 40, 60, 50]])),
                          gt_classes=torch.tensor([0, 5]))
    return [{"image": torch.rand(3, 64, 64) * 255, "instances": instances}] * 2


def _train_with_diagnostics(name, clip_value=None):
    clipping = [] if clip_value is None else [*cn.CLIP_GRADIENTS,
                                              "SOLVER.CLIP_GRADIENTS.CLIP_VALUE", clip_value]
    cfg = catalog.contender_cfg(name, 0, "unused", ["MODEL.FPN.OUT_CHANNELS", 32,
                                             "MODEL.FCOS.NUM_CONVS", 1, *clipping])
    model = catalog.build_contender(name, cfg).train()
    sgd = maybe_add_gradient_clipping(cfg, torch.optim.SGD)  # SGD itself without clipping
    trainer = SimpleTrainer(model, itertools.repeat(_batch()), sgd(model.parameters(), lr=0.001))
    watcher = diag.TrainingDiagnostics(model, every=2, window=2)
    trainer.register_hooks([watcher])
    trainer.train(0, 3)
    return watcher.record()


def test_a_run_of_fcos_d2_records_every_diagnostic():
    record = _train_with_diagnostics("fcos-d2 recipe")
    assert record["iterations"] == 3
    assert len(record["losses"]["loss_fcos_cls"]) == 2  # windows of 2 iterations: 0-1, 2
    assert all(len(w) == 3 for w in record["positives_per_level"])  # the recipe's P2-P4
    assert sum(record["positives_per_level"][0]) > 0
    assert record["grad_norm"]["total"]["mean"][0] > 0
    assert [s["iter"] for s in record["regression"]] == [0, 2]  # every 2, and the last
    assert len(record["regression"][0]["levels"]) == 3
    assert record["positive_scores"][0]["n"] > 0
    assert set(record["bn"]) == {"stem", "res2", "res3", "res4"}  # no res5 since issue 60
    assert record["bn"]["res2"]["running_var_mean"] > 0


def test_gradient_norms_before_the_step_are_the_same_unclipped_and_larger_clipped():
    plain = _train_with_diagnostics("fcos-d2 recipe")
    assert plain["grad_norm_before_step"] == plain["grad_norm"]["total"]
    clipped = _train_with_diagnostics("fcos-d2 recipe", clip_value=0.001)
    after, before = clipped["grad_norm"]["total"]["max"], clipped["grad_norm_before_step"]["max"]
    # each parameter's gradient is cut to norm 0.001: the total after is at most
    # 0.001 * sqrt(parameters); the unclipped norms are far above it
    bound = 0.001 * sum(1 for p in catalog.build_contender("fcos-d2 recipe", catalog.contender_cfg(
        "fcos-d2 recipe", 0, "unused", ["MODEL.FPN.OUT_CHANNELS", 32,
                                        "MODEL.FCOS.NUM_CONVS", 1])).parameters()) ** 0.5
    assert all(a <= bound * 1.0001 for a in after)
    assert all(b > 10 * a for a, b in zip(after, before))


def test_the_hook_leaves_the_losses_unchanged():
    cfg = catalog.contender_cfg("fcos-d2 recipe", 0, "unused", ["MODEL.FPN.OUT_CHANNELS", 32,
                                                         "MODEL.FCOS.NUM_CONVS", 1])
    torch.manual_seed(0)
    model = catalog.build_contender("fcos-d2 recipe", cfg).train()
    before = model(_batch())
    watcher = diag.TrainingDiagnostics(model)
    model.loss_normalizer.values = None  # the EMA starts over
    after = model(_batch())
    assert {k: v.item() for k, v in after.items()} == {k: v.item() for k, v in before.items()}
    assert watcher._labels is not None and watcher._outputs is not None


def test_a_run_of_detectron2s_fcos_records_its_positives_too():
    if importlib.util.find_spec("detectron2.modeling.meta_arch.fcos") is None:
        pytest.skip("the installed detectron2 has no detectron2.modeling.meta_arch.fcos")
    record = _train_with_diagnostics("detectron2")
    assert all(len(w) == 5 for w in record["positives_per_level"])
    assert sum(record["positives_per_level"][0]) > 0
    assert record["positive_scores"][0]["n"] > 0


def test_the_diagnostics_table_has_a_row_per_run_with_shares_and_medians():
    level = {"n": 4, "mean": 1.0, "std": 0.0, "q5": 1.0, "q25": 1.0, "q50": 1.5, "q75": 1.0,
             "q95": 1.0}
    diagnostics = {
        "losses": {"loss_fcos_cls": [0.9, 0.5], "loss_fcos_loc": [0.7, 0.25]},
        "grad_norm": {"total": {"mean": [2.0, 4.0], "max": [3.0, 9.5]}},
        "positives_per_level": [[30.0, 10.0], [50.0, 10.0]],  # 80 / 20 over the run
        "positive_scores": [{"iter": 0, "n": 0}, {"iter": 9, **level}],
        "regression": [{"iter": 9, "levels": [level, None]}],
        "bn": {"res2": {"running_var_mean": 1.234}},
    }
    clipped = {**diagnostics, "grad_norm_before_step": {"mean": [5.0, 6.0], "max": [40.0, 9.5]}}
    results = [{"contender": "a", "seed": 1, "AP": 4.56, "diagnostics": diagnostics},
               {"contender": "a", "seed": 2, "AP": 5.0, "diagnostics": clipped},
               {"contender": "a", "seed": 0, "AP": 1.0},  # no diagnostics: no row
               {"contender": "b", "seed": 0, "AP": 2.0, "diagnostics": {
                   **diagnostics, "losses": {"classification": [0.3], "bbox_regression": [0.2]},
                   "positives_per_level": None}}]
    rows = diag.summarise_diagnostics(results, ["a", "b"]).splitlines()
    assert rows[2] == ("| a | 1 | 4.6 | 0.500 / 0.250 | 3.00 / 9.5 | 80/20 | 1.500 | 1.50/- | "
                       "res2 1.23 |")
    assert rows[3] == ("| a | 2 | 5.0 | 0.500 / 0.250 | 3.00 / 9.5 (40.0 before clipping) | "
                       "80/20 | 1.500 | 1.50/- | res2 1.23 |")
    assert rows[4] == "| b | 0 | 2.0 | 0.300 / 0.200 | 3.00 / 9.5 | n/a | n/a | n/a | res2 1.23 |"
    assert len(rows) == 5


def test_level_shapes_of_a_padded_image():
    # 256 x 300 pads to 256 x 320: P3-P5 at strides 8-32, P6 and P7 halve rounding up
    assert diag.level_shapes(256, 300) == [(32, 40), (16, 20), (8, 10), (4, 5), (2, 3)]


def test_positives_are_counted_per_level_over_a_dataset_with_objects_left_out():
    dataset = [{"height": 64, "width": 64, "annotations": [{"bbox": [0, 0, 10, 10]},
                                                           {"bbox": [20, 20, 5, 5]}]},
               {"height": 64, "width": 64, "annotations": []}]

    def first_two_and_one_on_p4(locations, boxes):  # (R,) matches: box 0 only
        matched = torch.full((sum(len(x) for x in locations),), -1)
        matched[[0, 1, len(locations[0])]] = 0
        return matched

    rows = diag.positives_per_level(dataset, {"toy": first_two_and_one_on_p4}).splitlines()
    assert rows[2] == "| toy | 3 | 66.7 / 33.3 / 0.0 / 0.0 / 0.0 | 1 of 2 |"


def test_the_positives_table_of_the_thin_regime_names_every_contender(monkeypatch):
    monkeypatch.setattr(protocol, "register_datasets", lambda regime: None)
    from detectron2.data import DatasetCatalog

    dataset = [{"height": 256, "width": 288, "annotations": [{"bbox": [100, 100, 80, 70]}]}]
    monkeypatch.setattr(DatasetCatalog, "get", lambda name: dataset)
    former = f"{cn.RECIPE}+before-issue-60"  # the recipe's ranges on P3-P7
    rows = analyses.positives_table("thin", ["fcos-d2 official", former, cn.RECIPE]).splitlines()
    assert [r.split(" | ")[0] for r in rows[2:]] == ["| fcos-d2 official", f"| {former}",
                                                     "| fcos-d2 recipe"]
    assert "not on P3-P7: tools/analyze_data.py" in rows[4]  # the recipe's P2-P4
    # an 80-px object: its center region's farthest sides lie 40-64 px away, which is P3
    # under the official ranges (up to 64) and beyond P3 under the recipe's (up to 32)
    assert rows[2].split(" | ")[2].startswith("100.0 / 0.0")
    assert rows[3].split(" | ")[2].startswith("0.0 / ")


def test_weight_growth_is_one_as_initialised_and_squares_with_the_weights():
    cfg = catalog.contender_cfg("fcos-d2 recipe", 0, "unused", [])
    torch.manual_seed(0)
    backbone = catalog.build_contender("fcos-d2 recipe", cfg).backbone
    growth = diag.weight_growth(backbone.named_parameters())
    assert set(growth) == {"stem", "res2", "res3", "res4"}  # the recipe stops at res4
    assert all(abs(g - 1) < 0.05 for g in growth.values()), growth  # 9408 draws in the stem
    doubled = [(n, 2 * w if ".stem." in f".{n}." else w) for n, w in backbone.named_parameters()]
    grown = diag.weight_growth(doubled)
    assert grown["stem"] == pytest.approx(4 * growth["stem"], rel=1e-3)
    assert grown["res3"] == growth["res3"]


def test_rank_correlation_of_hand_made_values():
    assert diag.rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert diag.rank_correlation([1, 2, 3], [5, 1, 0]) == pytest.approx(-1.0)
    # ties take their mean rank: ranks (0.5, 0.5, 2) against (0, 1, 2)
    assert diag.rank_correlation([1, 1, 2], [1, 2, 3]) == pytest.approx(0.75 ** 0.5)


def test_weight_growth_table_reads_stored_runs(tmp_path):
    stem = torch.ones(4, 1, 3, 3) / 6  # squared norm 1; expected 36 * 2 / 36 = 2: growth 0.5
    for seed, scale in ((0, 1.0), (1, 2.0), (2, 3.0)):
        torch.save({"model": {"backbone.bottom_up.stem.conv1.weight": scale * stem}},
                   tmp_path / f"w{seed}.pth")
    runs = [("a", seed, tmp_path / f"w{seed}.pth") for seed in range(3)]
    bn = lambda v: {"bn": {"stem": {"running_var_mean": v}}}  # noqa: E731
    results = [{"contender": "a", "seed": 0, "AP": 9.0, "diagnostics": bn(1.0)},
               {"contender": "a", "seed": 1, "AP": 5.0, "diagnostics": bn(3.0)},
               {"contender": "a", "seed": 2, "AP": 7.0, "diagnostics": bn(2.0)}]
    lines = diag.weight_growth_table(runs, results).splitlines()
    assert lines[2] == "| a | 0 | 9.0 | 1.00 | stem 0.50 |"
    assert lines[3] == "| a | 1 | 5.0 | 3.00 | stem 2.00 |"
    assert lines[-1] == ("Rank correlation over 3 runs: AP with the stem's growth -0.50; over "
                         "the 3 with diagnostics, the stem's BN running_var with its growth "
                         "+0.50")
