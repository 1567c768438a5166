"""benchmarks.train_quality: every contender builds on the same backbone and optimizer, the
variants switch exactly what they name, the adapters speak detectron2's model interface,
and the table reports mean, spread and range over seeds."""
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from detectron2.structures import Boxes, Instances

from benchmarks import runner
from benchmarks.train_quality import catalog, cli, labelenc as le, protocol
from benchmarks.train_quality import contenders as cn, results as run_results


def _get(cfg, key):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _cfg(name, *opts):
    cfg = catalog.contender_cfg(name, 0, "unused", ["MODEL.FPN.OUT_CHANNELS", 64,
                                             "MODEL.FCOS.NUM_CONVS", 1, *opts])
    return cfg


def _skip_without_detectron2_fcos():
    if importlib.util.find_spec("detectron2.modeling.meta_arch.fcos") is None:
        pytest.skip("the installed detectron2 has no detectron2.modeling.meta_arch.fcos "
                    "(v0.6 and main have it)")


def _batch():
    torch.manual_seed(0)
    instances = Instances((128, 128))
    instances.gt_boxes = Boxes(torch.tensor([[10.0, 20.0, 60.0, 70.0], [80, 80, 120, 100]]))
    instances.gt_classes = torch.tensor([0, 5])
    return [{"image": torch.rand(3, 128, 128) * 255, "instances": instances,
             "height": 128, "width": 128}]


@pytest.mark.parametrize("variant", list(cn.VARIANTS))
def test_each_variant_changes_exactly_the_keys_it_names(variant):
    official, cfg = _cfg("fcos-d2 official"), _cfg(f"fcos-d2 {variant}")
    overrides = cn.VARIANTS[variant]
    changed = {key for key in overrides[::2] if _get(official, key) != _get(cfg, key)}
    assert changed == set(overrides[::2])
    official.defrost()
    official.merge_from_list(overrides)
    assert official == cfg


def test_official_contender_has_the_official_defaults_and_recipe_differs():
    from detectron2.config import get_cfg

    from fcos_d2 import add_fcos_config

    defaults = get_cfg()
    add_fcos_config(defaults)
    official = _cfg("fcos-d2 official")
    # every MODEL.FCOS key at its default (the official FCOS) but those of the regime
    regime = {"NUM_CLASSES", "NUM_CONVS"}  # 6 shapes; NUM_CONVS narrowed by this test
    differ = {k for k, v in official.MODEL.FCOS.items() if v != defaults.MODEL.FCOS[k]}
    assert differ == regime
    recipe = _cfg(cn.RECIPE)
    assert any(_get(recipe, key) != _get(official, key) for key in cn.OFFICIAL[::2])


def test_regime_is_the_recipe_config_at_half_length():
    cfg = _cfg("fcos-d2 official")
    assert (cfg.SOLVER.MAX_ITER, cfg.SOLVER.STEPS, cfg.SOLVER.IMS_PER_BATCH) == (600, (500,), 4)
    assert cfg.MODEL.RESNETS.DEPTH == 18 and cfg.MODEL.WEIGHTS == ""
    assert cfg.MODEL.FCOS.IN_FEATURES == ["p3", "p4", "p5", "p6", "p7"]


def test_torchvision_adapter_trains_and_returns_detectron2_instances():
    cfg = _cfg("torchvision")
    model = catalog.build_contender("torchvision", cfg)
    model.train()
    losses = model(_batch())
    assert set(losses) == {"classification", "bbox_regression", "bbox_ctrness"}
    assert all(torch.isfinite(v) for v in losses.values())
    model.eval()
    model.fcos.score_thresh = 0.0  # an untrained model: keep every candidate
    with torch.no_grad():
        (result,) = model(_batch())
    instances = result["instances"]
    assert instances.image_size == (128, 128) and len(instances) > 0
    assert instances.pred_classes.max() < cfg.MODEL.FCOS.NUM_CLASSES


@pytest.mark.parametrize("name", ["fcos-d2 recipe", "torchvision", "detectron2",
                                  "detectron2 faster-rcnn"])
def test_every_contender_is_built_on_model_device(name):
    # "meta" stands in for "cuda" where there is no GPU: a contender left on the CPU fails
    if name == "detectron2":
        _skip_without_detectron2_fcos()
    model = catalog.build_contender(name, _cfg(name, "MODEL.DEVICE", "meta"))
    devices = {p.device.type for p in model.parameters()}
    devices |= {b.device.type for b in model.buffers()}
    assert devices == {"meta"}


def test_detectron2_adapter_builds_when_detectron2_has_fcos():
    _skip_without_detectron2_fcos()
    cfg = _cfg("detectron2")
    model = catalog.build_contender("detectron2", cfg)
    model.train()
    from detectron2.utils.events import EventStorage

    with EventStorage():
        losses = model(_batch())
    assert set(losses) == {"loss_fcos_cls", "loss_fcos_loc", "loss_fcos_ctr"}


def test_detectron2_contender_keeps_its_own_prior_whatever_the_recipe_has():
    _skip_without_detectron2_fcos()
    for prior in ("0.1", "0.3"):
        cfg = _cfg("detectron2", "MODEL.FCOS.PRIOR_PROB", prior)
        bias = catalog.build_contender("detectron2", cfg).head.cls_score.bias
        assert torch.allclose(bias, torch.full_like(bias, -math.log(99.0)))


@pytest.mark.parametrize("name", ["detectron2", "torchvision", "detectron2+adamw"])
def test_other_projects_fcos_keep_their_own_center_radius_whatever_the_recipe_has(name):
    assert _cfg(cn.RECIPE).MODEL.FCOS.CENTER_SAMPLING_RADIUS != 1.5  # the recipe's 1.0
    assert _cfg(name).MODEL.FCOS.CENTER_SAMPLING_RADIUS == 1.5  # their default and ours
    assert _cfg("fcos-d2 official").MODEL.FCOS.CENTER_SAMPLING_RADIUS == 1.5


def test_detectron2_adapter_trains_on_an_image_without_boxes_as_main_does():
    _skip_without_detectron2_fcos()
    from detectron2.utils.events import EventStorage

    model = catalog.build_contender("detectron2", _cfg("detectron2")).train()
    empty = _batch()[0]
    empty["instances"] = empty["instances"][:0]
    with EventStorage():
        losses = model([empty, *_batch()])
        sides = [math.ceil(128 / s) for s in model.anchor_generator.strides]
        anchors = model.anchor_generator([torch.zeros(1, 1, n, n) for n in sides])
        labels, boxes = model.label_anchors(anchors, [empty["instances"]])
    count = sum(n * n for n in sides)
    assert all(torch.isfinite(v) for v in losses.values())
    assert labels[0].tolist() == [model.num_classes] * count
    assert boxes[0].tensor.shape == (count, 4)


def test_table_reports_mean_sample_std_and_range_over_seeds():
    results = [{"contender": "a", "seed": s, "AP": ap, "AP50": 2 * ap, "status": "ok"}
               for s, ap in enumerate([1.0, 2.0, 6.0])]
    results.append({"contender": "b", "seed": 0, "AP": 0.0, "AP50": 0.0,
                    "status": "diverged: loss became infinite"})
    table = run_results.summarise(results, ["a", "b"]).splitlines()
    std = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 2)
    assert table[2] == f"| a | 0,1,2 | 3.0 | {std:.1f} | 1.0-6.0 | 6.0 | {2 * std:.1f} |"
    assert "seed 0 diverged" in table[3]


def test_labelenc_contenders_follow_the_official_proportions_of_the_regime():
    step1 = catalog.contender_cfg(le.LABELENC, 0, "unused", [], labelenc_step=1)
    assert (step1.MODEL.LABELENC.STEP, step1.SOLVER.MAX_ITER, step1.SOLVER.STEPS) == \
        (1, 800, (700,))
    step2 = catalog.contender_cfg(le.LABELENC, 0, "unused", [], labelenc_step=2)
    assert (step2.MODEL.LABELENC.STEP, step2.SOLVER.MAX_ITER) == (2, 600)
    assert step2.MODEL.LABELENC.AUXILIARY_LOSS_ITERS == 533  # 8/9, as 80000 of 90000
    longer = catalog.contender_cfg(cn.SAME_ITERATIONS, 0, "unused", [])
    assert longer.SOLVER.MAX_ITER == 800 + 600 and longer.MODEL.LABELENC.STEP == 0


def test_the_lef_only_contender_trains_no_detector_in_step1_for_the_regimes_length():
    step1 = catalog.contender(le.LABELENC_LEF_ONLY).step_config(1, 0, "unused")
    assert (step1.MODEL.LABELENC.STEP, step1.MODEL.LABELENC.STEP1_DETECTOR) == (1, False)
    assert (step1.SOLVER.MAX_ITER, step1.SOLVER.STEPS) == (600, (500,))  # no warm-up added
    official = catalog.contender(le.LABELENC).step_config(1, 0, "unused")
    assert official.MODEL.LABELENC.STEP1_DETECTOR and official.SOLVER.MAX_ITER == 800
    step2 = catalog.contender_cfg(le.LABELENC_LEF_ONLY, 0, "unused", [], labelenc_step=2)
    assert step2 == catalog.contender_cfg(le.LABELENC, 0, "unused", [], labelenc_step=2)
    assert le.LABELENC_LEF_ONLY in catalog.contender_names()


def test_times_table_averages_the_step1_aps_runs_recorded():
    runs = [{"contender": "le", "seed": s, "status": "ok", "train_seconds": 10.0 + s,
             "train_seconds_step1": 4.0, "train_seconds_step2": 6.0 + s, **extra}
            for s, extra in enumerate([{"step1_AP": None, "step1_lef_AP": 40.0},
                                       {"step1_AP": None, "step1_lef_AP": 50.0}])]
    runs.append({"contender": "old", "seed": 0, "status": "ok", "train_seconds": 9.0,
                 "train_seconds_step1": 4.0, "train_seconds_step2": 5.0, "step1_AP": 6.0})
    runs.append({**runs[-1], "seed": 1, "step1_AP": 8.0, "step1_lef_AP": 10.0})
    rows = run_results.summarise_times(runs, ["le", "old"]).splitlines()
    assert rows[2] == "| le | 10 | 4 + 6 |  | 45.0 |"
    assert rows[3] == "| old | 9 | 4 + 5 | 7.0 | 10.0 (1 of 2 runs) |"


def test_a_lef_only_labelenc_run_reports_the_lef_ap_and_no_detector_ap(tmp_path, dataset):
    from detectron2.data import DatasetCatalog

    from fcos_d2.data import register_coco_dataset

    name = "train_quality_lef_only_toy"  # conftest's 4 synthetic-shapes images, 6 classes
    if name not in DatasetCatalog.list():
        register_coco_dataset(name, str(dataset / "annotations.json"), str(dataset / "images"))
    opts = ["DATASETS.TRAIN", (name,), "DATASETS.TEST", (name,), "SOLVER.MAX_ITER", 2,
            "SOLVER.STEPS", (), "SOLVER.IMS_PER_BATCH", 2, "INPUT.MIN_SIZE_TRAIN", (64,),
            "INPUT.MAX_SIZE_TRAIN", 64, "INPUT.MIN_SIZE_TEST", 64, "INPUT.MAX_SIZE_TEST", 64,
            "MODEL.RESNETS.DEPTH", 18, "MODEL.RESNETS.RES2_OUT_CHANNELS", 64,
            "MODEL.FPN.OUT_CHANNELS", 64, "MODEL.FCOS.NUM_CONVS", 1,
            "MODEL.LABELENC.AUXILIARY_LOSS_ITERS", 1, "MODEL.FCOS.INFERENCE_TH_TEST", 0.0]
    lef_only = catalog.contender(le.LABELENC_LEF_ONLY)
    record = le.run_labelenc(lef_only, 0, str(tmp_path / "run"), opts)
    assert record["status"] == "ok" and record["contender"] == le.LABELENC_LEF_ONLY
    assert record["step1_AP"] is None and 0 <= record["step1_lef_AP"] <= 100
    assert 0 <= record["AP"] <= 100
    assert set(record["final_losses_step1"]) >= {"loss_labelenc_cls", "loss_labelenc_loc"}
    assert not any(k.startswith("loss_fcos") for k in record["final_losses_step1"])
    assert (tmp_path / "run" / "step2" / "model_final_fcos.pth").is_file()
    # both steps' iterations, as its training seconds are both steps' (step 2: MAX_ITER 2)
    assert record["iterations"] == record["iterations_step1"] + 2


@pytest.mark.parametrize("variant", list(le.STEP2_VARIANTS))
def test_each_step2_variant_changes_exactly_its_keys_of_labelencs_step2(variant):
    official = catalog.contender_cfg(le.LABELENC, 0, "unused", [], labelenc_step=2)
    cfg = catalog.contender_cfg(variant, 0, "unused", le.STEP2_VARIANTS[variant], labelenc_step=2)
    keys = le.STEP2_VARIANTS[variant][::2]
    assert any(_get(cfg, k) != _get(official, k) for k in keys)
    official.defrost()
    official.merge_from_list(le.STEP2_VARIANTS[variant])
    assert official == cfg and variant in catalog.contender_names()


def test_a_step2_variant_waits_for_labelenc_of_its_seed():
    variant = next(iter(le.STEP2_VARIANTS))
    todo = [(variant, 0), (le.LABELENC, 0), (variant, 1)]
    waits = cli.step2_can_start(True)
    assert runner.next_ready(todo, [], waits) == 1
    assert runner.next_ready([(variant, 0)], [(le.LABELENC, 0, None, 0.0)], waits) is None
    assert runner.next_ready([(variant, 0)], [(le.LABELENC, 1, None, 0.0)], waits) == 0


def _stored_step1(root, seed, regime="thin", **opts):
    """An earlier benchmark's folder with LabelEnc's run of `seed`: its record (with its
    overrides `opts` if given), its weights."""
    weights = le.step1_weights(root, seed)
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"weights")
    record = {"contender": le.LABELENC, "seed": seed, "regime": regime, "step1_AP": 1.5,
              "step1_lef_AP": 70.0, "train_seconds_step1": 9.0, "AP": 30.0, **opts}
    (root / "results.jsonl").write_text(json.dumps(record) + "\n")


def test_a_step2_variant_starts_from_the_step1_of_the_folder_it_is_given(tmp_path, monkeypatch):
    _stored_step1(tmp_path / "earlier", 2)
    calls = []
    monkeypatch.setattr(le, "run_step2", lambda *args: calls.append(args))
    variant = catalog.contender(next(iter(le.STEP2_VARIANTS)))
    here = str(tmp_path / "new" / "runs" / f"{variant.name}-2")
    le.run_step2_variant(variant, 2, here, [], "thin", step1_from=str(tmp_path / "earlier"))
    (contender, overrides, seed, output_dir, _, weights, step1_record, regime), = calls
    assert (contender, overrides) == (variant, le.STEP2_VARIANTS[variant.name])
    assert (seed, output_dir, regime) == (2, here, "thin")
    assert weights == str(le.step1_weights(tmp_path / "earlier", 2))
    assert step1_record == {"step1_AP": 1.5, "step1_lef_AP": 70.0, "train_seconds_step1": 9.0}
    with pytest.raises(FileNotFoundError, match="seed 3: no step-1 weights .*--step1-from"):
        le.run_step2_variant(variant, 3, here, [], "thin", step1_from=str(tmp_path / "earlier"))
    with pytest.raises(FileNotFoundError, match="seed 2: no step-1 weights .*--output"):
        le.run_step2_variant(variant, 2, here, [], "thin")  # nothing beside it


def test_a_stored_step1_needs_its_record_of_the_same_regime(tmp_path):
    _stored_step1(tmp_path, 1)
    assert le.missing_step1(tmp_path, 1, "thin") is None
    (tmp_path / "results.jsonl").write_text("")
    assert "no record of" in le.missing_step1(tmp_path, 1, "thin")
    _stored_step1(tmp_path / "shapes", 1, regime="shapes")
    with pytest.raises(SystemExit, match="regime \\['shapes'\\]"):
        le.missing_step1(tmp_path / "shapes", 1, "thin")


def test_a_stored_step1_trained_with_other_overrides_is_refused_whatever_the_device(tmp_path):
    _stored_step1(tmp_path, 1, opts=["SOLVER.MAX_ITER", "20", "MODEL.DEVICE", "cuda"])
    assert le.missing_step1(tmp_path, 1, "thin", ["SOLVER.MAX_ITER", 20]) is None
    problem = le.missing_step1(tmp_path, 1, "thin", [])
    assert problem == (f"'{le.LABELENC}' seed 1 ran with the overrides ['SOLVER.MAX_ITER', "
                       "'20', 'MODEL.DEVICE', 'cuda'], not none")
    _stored_step1(tmp_path / "older", 1)  # a record from before records kept their overrides
    assert le.missing_step1(tmp_path / "older", 1, "thin", ["SOLVER.MAX_ITER", 20]) is None


def test_with_step1_from_elsewhere_a_step2_variant_does_not_wait_and_its_child_is_told(tmp_path):
    variant = next(iter(le.STEP2_VARIANTS))
    assert runner.next_ready([(variant, 0), (le.LABELENC, 0)], [], cli.step2_can_start(False)) == 0
    script = tmp_path / "child.py"
    script.write_text("import sys, pathlib\n"
                      "pathlib.Path(sys.argv[sys.argv.index('--output') + 1], 'argv.txt')"
                      ".write_text(' '.join(sys.argv[1:]))\n")
    runner.run_all([(variant, 1), (le.LABELENC, 1)], 1, tmp_path, [], [sys.executable, str(script)],
                   extra_args=["--step1-from", "earlier"], can_start=cli.step2_can_start(False))
    # one job at a time: the variant ran first (it waited for nothing), LabelEnc wrote last
    assert (tmp_path / "argv.txt").read_text() == (
        f"--run {le.LABELENC} --seed 1 --output {tmp_path} --step1-from earlier")
    assert (tmp_path / f"log-{variant.replace(' ', '_')}-1.txt").exists()


def test_the_command_refuses_step1_from_a_folder_without_the_seeds_step1(
        tmp_path, monkeypatch, capsys):
    _stored_step1(tmp_path, 1)
    variant = next(iter(le.STEP2_VARIANTS))
    monkeypatch.setattr(sys, "argv", ["train_quality.py", "--regime", "thin", "--contenders",
                                      variant, "--seeds", "1", "2", "--step1-from",
                                      str(tmp_path), "--output", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and f"--step1-from {tmp_path}: no step-1 weights" in error
    assert f"{le.LABELENC}-2" in error and f"{le.LABELENC}-1" not in error
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- regime 2 ("thin")

def test_thin_regime_has_its_own_data_classes_and_sizes_and_the_same_model_and_schedule():
    shapes = _cfg("fcos-d2 recipe")
    thin = catalog.contender_cfg(cn.RECIPE, 0, "unused", ["MODEL.FPN.OUT_CHANNELS", 64,
                                                  "MODEL.FCOS.NUM_CONVS", 1], regime="thin")
    assert thin.DATASETS.TRAIN == ("train_quality_thin_train",)
    assert thin.DATASETS.TEST == ("train_quality_thin_val",)
    assert thin.MODEL.FCOS.NUM_CLASSES == 10
    assert (thin.INPUT.MIN_SIZE_TRAIN, thin.INPUT.MAX_SIZE_TRAIN) == ((256,), 352)
    assert (thin.INPUT.MIN_SIZE_TEST, thin.INPUT.MAX_SIZE_TEST) == (256, 352)
    differ = {f"{section}.{key}" for section in ("MODEL", "SOLVER", "INPUT", "DATASETS")
              for key, value in shapes[section].items() if thin[section][key] != value}
    assert differ == {"MODEL.FCOS", "INPUT.MIN_SIZE_TRAIN", "INPUT.MAX_SIZE_TRAIN",
                      "INPUT.MIN_SIZE_TEST", "INPUT.MAX_SIZE_TEST", "DATASETS.TRAIN",
                      "DATASETS.TEST"}
    assert {k for k, v in shapes.MODEL.FCOS.items() if thin.MODEL.FCOS[k] != v} == {"NUM_CLASSES"}


def test_shapes_regime_keeps_todays_data_and_seeds_and_thin_has_five_seeds_elsewhere():
    cfg = _cfg("fcos-d2 official")
    assert (cfg.DATASETS.TRAIN, cfg.DATASETS.TEST) == ((protocol.TRAIN_NAME,), (protocol.VAL_NAME,))
    shapes = protocol.REGIMES["shapes"]
    assert shapes.datasets == protocol.DATASETS and shapes.overrides == ()
    assert protocol.REGIMES["shapes"].seeds == (0, 1, 2)
    assert protocol.REGIMES["thin"].seeds == (0, 1, 2, 3, 4)
    assert protocol.REGIMES["shapes"].output == "train_quality" != protocol.REGIMES["thin"].output


def test_a_variant_may_change_the_schedule():
    assert _cfg("fcos-d2 warmup-200").SOLVER.WARMUP_ITERS == 200
    assert _cfg("fcos-d2 official").SOLVER.WARMUP_ITERS == 50


def test_records_carry_their_overrides_and_those_of_the_thin_regime_carry_it(monkeypatch):
    class Fake(cn.Contender):
        def run(self, *args, **kwargs):
            return [{"contender": self.name, "AP": 1.0}]

    monkeypatch.setattr(protocol, "register_datasets", lambda regime: None)
    monkeypatch.setattr(catalog, "contender", Fake)
    assert cli.run_one("x", 0, "unused", [], regime="thin") == \
        [{"contender": "x", "AP": 1.0, "opts": [], "regime": "thin"}]
    assert cli.run_one("x", 0, "unused", ["SOLVER.MAX_ITER", 20]) == \
        [{"contender": "x", "AP": 1.0, "opts": ["SOLVER.MAX_ITER", "20"]}]


def test_the_command_refuses_an_output_whose_runs_had_other_overrides(tmp_path, monkeypatch):
    record = {"contender": cn.RECIPE, "seed": 0, "AP": 5.0, "opts": ["SOLVER.MAX_ITER", "20"]}
    (tmp_path / "results.jsonl").write_text(json.dumps(record) + "\n")
    monkeypatch.setattr(cli, "run_all", lambda *args, **kwargs: pytest.fail("trained"))
    monkeypatch.setattr(sys, "argv", ["train_quality.py", "--contenders", cn.RECIPE,
                                      "--seeds", "0", "1", "--output", str(tmp_path)])
    with pytest.raises(SystemExit, match=(
            f"results.jsonl: '{cn.RECIPE}' seed 0 ran with the overrides \\['SOLVER.MAX_ITER', "
            "'20'\\], not none; use another --output")):
        cli.main()
    assert (tmp_path / "results.jsonl").read_text() == json.dumps(record) + "\n"
    # the same overrides, or another device only, are this folder's: its record stays done
    assert run_results.other_overrides([record], ["MODEL.DEVICE", "cuda",
                                                  "SOLVER.MAX_ITER", 20]) is None


def test_results_of_another_regime_are_refused(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"contender": "a", "seed": 0}\n')  # no "regime": shapes
    assert len(run_results.checked_results(path, "shapes")) == 1
    with pytest.raises(SystemExit, match="regime \\['shapes'\\].*--regime thin"):
        run_results.checked_results(path, "thin")


def test_children_get_the_regime_and_diagnostics_flags_before_the_overrides(tmp_path):
    script = tmp_path / "child.py"
    script.write_text("import sys, pathlib\n"
                      "pathlib.Path(sys.argv[sys.argv.index('--output') + 1], 'argv.txt')"
                      ".write_text(' '.join(sys.argv[1:]))\n")
    runner.run_all([("fcos-d2 recipe", 3)], 1, tmp_path, ["SOLVER.MAX_ITER", "20"],
                   [sys.executable, str(script)], extra_args=["--regime", "thin", "--diagnostics"])
    assert (tmp_path / "argv.txt").read_text() == (
        f"--run fcos-d2 recipe --seed 3 --output {tmp_path} --regime thin --diagnostics "
        "SOLVER.MAX_ITER 20")


@pytest.mark.parametrize("variant", list(cn.RECIPE_VARIANTS))
def test_each_recipe_variant_changes_exactly_the_keys_it_names_on_the_recipe(variant):
    recipe, cfg = _cfg(cn.RECIPE), _cfg(f"{cn.RECIPE}+{variant}")
    overrides = cn.RECIPE_VARIANTS[variant]
    assert {key for key in overrides[::2] if _get(recipe, key) != _get(cfg, key)} == \
        set(overrides[::2])
    recipe.defrost()
    recipe.merge_from_list(overrides)
    assert recipe == cfg
    assert f"{cn.RECIPE}+{variant}" in catalog.contender_names()


def family_order():
    """The family's rows: family.py's and the members as designed (family_designed.py)."""
    from benchmarks.train_quality.family import FAMILY_ORDER
    from benchmarks.train_quality.family_designed import DESIGNED_ORDER

    return [*FAMILY_ORDER, *DESIGNED_ORDER]


def test_all_of_the_shapes_regime_is_todays_contenders_and_thin_runs_every_one():
    names = catalog.contender_names()
    shapes = catalog.default_contenders(names, "shapes")
    thin = catalog.default_contenders(names, "thin")
    # the references are contenders of their own (the recipe, Faster R-CNN, a recipe variant)
    family = set(family_order()) - {"fcos-d2 recipe", "detectron2 faster-rcnn",
                                    "fcos-d2 recipe+p3-p7"}
    # the family's rows by --contenders family only, in either regime
    assert thin == [n for n in names if n not in family]
    assert {"detectron2", "fcos-d2 like-detectron2", "torchvision"} <= set(thin)
    assert set(names) - set(shapes) == set(catalog.ADDED_WITH_THIN) | family
    assert "fcos-d2 atss" in thin and "fcos-d2 recipe+atss" in thin


@pytest.mark.parametrize("variant", list(cn.DETECTRON2_VARIANTS))
def test_a_detectron2_variant_is_detectron2s_fcos_with_exactly_its_schedule_change(variant):
    name = f"{catalog.DETECTRON2}+{variant}"
    base, cfg = _cfg(catalog.DETECTRON2), _cfg(name)
    base.defrost()
    base.merge_from_list(cn.DETECTRON2_VARIANTS[variant])
    assert base == cfg and name in catalog.contender_names()
    assert all(key.startswith("SOLVER.") for key in cn.DETECTRON2_VARIANTS[variant][::2])
    if importlib.util.find_spec("detectron2.modeling.meta_arch.fcos") is None:
        pytest.skip("the installed detectron2 has no detectron2.modeling.meta_arch.fcos "
                    "(v0.6 and main have it); the config part above ran")
    from detectron2.modeling.meta_arch.fcos import FCOS

    assert isinstance(catalog.build_contender(name, cfg), FCOS)


def _toy_dataset(folder: Path, name: str) -> None:
    """Registers `name`: 6 random 64 x 64 images in `folder` with one box each."""
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from detectron2.structures import BoxMode
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    records = []
    for i in range(6):
        path = folder / f"{i}.png"
        pixels = torch.randint(0, 255, (64, 64, 3), generator=generator, dtype=torch.uint8)
        Image.fromarray(pixels.numpy()).save(path)
        records.append({"file_name": str(path), "image_id": i, "height": 64, "width": 64,
                        "annotations": [{"bbox": [8 + i, 10, 30, 24], "bbox_mode": BoxMode.XYWH_ABS,
                                         "category_id": i % 3}]})
    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
    DatasetCatalog.register(name, lambda: records)
    MetadataCatalog.get(name).set(thing_classes=["a", "b", "c"])


def test_init_seed_reseeds_the_initial_weights_alone_and_equal_to_the_seed_is_the_plain_run(
        tmp_path, monkeypatch):
    _toy_dataset(tmp_path, "train_quality_init_seed_toy")
    cfg = _cfg(cn.RECIPE, "DATASETS.TRAIN", ("train_quality_init_seed_toy",),
               "SOLVER.MAX_ITER", 3, "SOLVER.IMS_PER_BATCH", 2, "INPUT.MIN_SIZE_TRAIN", (64,),
               "INPUT.MAX_SIZE_TRAIN", 64, "MODEL.RESNETS.DEPTH", 18,
               "MODEL.RESNETS.RES2_OUT_CHANNELS", 64)
    build, runs = catalog.build_contender, []

    def recording_build(cfg):  # the initial weights and what each iteration is fed
        model = build(cn.RECIPE, cfg)
        initial = [p.detach().clone() for p in model.parameters()]
        fed = []
        forward = model.forward
        model.forward = lambda batch: (fed.append(
            [(d["file_name"], d["image"][0, 0, :6].tolist()) for d in batch]), forward(batch))[1]
        runs.append((initial, fed))
        return model

    plain, _ = protocol.train(recording_build, cfg, seed=0)
    same, _ = protocol.train(recording_build, cfg, seed=0, init_seed=0)
    other, _ = protocol.train(recording_build, cfg, seed=0, init_seed=1)
    (plain_init, plain_fed), (same_init, same_fed), (other_init, other_fed) = runs
    assert len(plain_fed) == 3 and plain_fed == same_fed == other_fed  # images and flips
    assert all(torch.equal(a, b) for a, b in zip(plain_init, same_init))
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(),
                                                 same.state_dict().values()))
    assert not all(torch.equal(a, b) for a, b in zip(plain_init, other_init))


def test_the_protocol_trains_with_the_optimizer_the_config_names(tmp_path, monkeypatch,
                                                                  capsys):
    """SOLVER.OPTIMIZER reaches the benchmark (detectron2's build_optimizer is SGD only);
    each training reports its iterations (runner.iteration_progress)."""
    import fcos_d2.engine.optimizer as optimizers

    monkeypatch.setenv("FCOS_D2_PROGRESS", "0")  # a progress line at every iteration
    _toy_dataset(tmp_path, "train_quality_optimizer_toy")
    built, build = [], optimizers.build_optimizer
    monkeypatch.setattr(optimizers, "build_optimizer",
                        lambda cfg, model: built.append(build(cfg, model)) or built[-1])
    for name in (f"{cn.RECIPE}+sgd", cn.RECIPE, f"{catalog.DETECTRON2}+adamw"):
        if name.startswith(catalog.DETECTRON2) and \
                importlib.util.find_spec("detectron2.modeling.meta_arch.fcos") is None:
            print("skipped detectron2+adamw: the installed detectron2 has no FCOS")
            continue
        cfg = _cfg(name, "DATASETS.TRAIN", ("train_quality_optimizer_toy",),
                   "SOLVER.MAX_ITER", 1, "SOLVER.IMS_PER_BATCH", 2,
                   "INPUT.MIN_SIZE_TRAIN", (64,), "INPUT.MAX_SIZE_TRAIN", 64)
        protocol.train(catalog.contender(name).build, cfg, seed=0)
    assert isinstance(built[0], torch.optim.SGD)
    assert all(isinstance(o, torch.optim.AdamW) for o in built[1:]) and len(built) >= 2
    assert (built[1].defaults["lr"], built[1].defaults["weight_decay"]) == (0.001, 0.05)
    reported = [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("training: 1/1 iterations (100%)")]
    assert len(reported) == len(built) and all("loss=" in line for line in reported)


class _Toy(torch.nn.Module):
    """One weight, loss weight x batch; each call appended to `calls` as `record(self, batch)`."""

    def __init__(self, name, calls, record=lambda toy, batch: (toy.name, batch)):
        super().__init__()
        self.name, self.weight = name, torch.nn.Parameter(torch.ones(()))
        self.calls, self.record = calls, record

    def forward(self, batch):
        self.calls.append(self.record(self, batch))
        return {"loss": self.weight * batch}


def test_iteration_costs_time_the_models_in_turn_after_a_warm_up_round():
    from benchmarks.train_quality.costs import timed_rounds

    calls = []
    models = {"a": _Toy("a", calls), "b": _Toy("b", calls)}
    optimizers = {k: torch.optim.SGD(m.parameters(), lr=0.5) for k, m in models.items()}
    seconds = timed_rounds(models, optimizers, {"a": lambda r: r, "b": lambda r: 10 * r},
                            repeats=2, storage_iter=0)
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("b", 10), ("a", 2), ("b", 20)]
    assert [len(s) for s in seconds.values()] == [2, 2]  # the warm-up round is not timed
    assert models["a"].weight.item() == 1.0 - 0.5 * (0 + 1 + 2)  # a step each round


def test_contender_costs_run_each_model_in_its_own_precision():
    from benchmarks.train_quality.costs import contender_cost_table, timed_rounds

    seen = []
    autocast = lambda toy, batch: (toy.name, torch.is_autocast_enabled("cpu"))  # noqa: E731
    models = {"bf16": _Toy("bf16", seen, autocast), "fp32": _Toy("fp32", seen, autocast)}
    optimizers = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, m in models.items()}
    timed_rounds(models, optimizers, {k: lambda r: float(r) for k in models}, repeats=1,
                 storage_iter=0, autocast={"bf16": True})
    assert seen == [("bf16", True), ("fp32", False)] * 2
    assert contender_cost_table({"a": 0.2, "b": 0.5}).splitlines()[2:] == \
        ["| a | 0.200 | 1.00 |", "| b | 0.500 | 2.50 |"]


def test_cost_tables_divide_by_the_reference_and_a_cost_estimate_is_recorded(
        monkeypatch, records_dir):
    from benchmarks import records
    from benchmarks.train_quality import costs

    table = costs.regime_cost_table({"shapes": 0.5, "thin": 2.0}).splitlines()
    assert table[2:] == ["| shapes | 0.500 | 1.00 | 5 |", "| thin | 2.000 | 4.00 | 20 |"]
    medians = {cn.RECIPE: 1.0, "LabelEnc step 1": 1.5}
    monkeypatch.setattr(costs, "labelenc_iteration_seconds", lambda repeats: medians)
    printed = cli.cost_estimate(cli._parser().parse_args(["--labelenc-cost", "3"]),
                                ["--labelenc-cost", "3"])
    assert printed.splitlines()[3] == "| LabelEnc step 1 | 1.500 | 1.50 |"
    (record,) = records.read_records(records_dir / "train_quality_costs.jsonl")
    assert record["metrics"] == {"median_seconds_per_iteration": medians}
    assert record["run"] == {"kind": "labelenc-cost", "repeats": 3, "reference": cn.RECIPE}
    assert record["command"] == "python -m benchmarks.train_quality --labelenc-cost 3"


@pytest.mark.parametrize("amp", [False, True])
def test_the_protocol_trains_in_bf16_autocast_with_amp_as_train_net_does(amp, dataset,
                                                                        monkeypatch):
    from detectron2.data import DatasetCatalog

    from fcos_d2.data import register_coco_dataset
    from fcos_d2.engine import amp as amp_module

    name = "train_quality_amp_toy"  # conftest's 4 synthetic-shapes images
    if name not in DatasetCatalog.list():
        register_coco_dataset(name, str(dataset / "annotations.json"), str(dataset / "images"))
    precisions = []
    replacing = amp_module.CPUAMPTrainer.replacing.__func__
    monkeypatch.setattr(amp_module.CPUAMPTrainer, "replacing", classmethod(
        lambda cls, trainer, precision: precisions.append(precision) or
        replacing(cls, trainer, precision)))
    cfg = protocol.setup_cfg(0, "unused", opts=[
        "DATASETS.TRAIN", (name,), "DATASETS.TEST", (name,), "SOLVER.MAX_ITER", 1,
        "SOLVER.IMS_PER_BATCH", 2, "MODEL.FPN.OUT_CHANNELS", 32, "MODEL.FCOS.NUM_CONVS", 1,
        "SOLVER.AMP.ENABLED", amp, "MODEL.FCOS.CPU_BF16", "always"])
    _, record = protocol.train(catalog.contender("fcos-d2 recipe").build, cfg, 0)
    assert record["status"] == "ok" and record["iterations"] == 1
    assert precisions == ([torch.bfloat16] if amp else [])
