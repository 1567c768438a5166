"""benchmarks.masks, its plumbing only (the measurement itself is `make mask-quality`):
both contenders share one regime and differ in the detector, Mask R-CNN trains on the
shared trunk and returns masks, and the table reports mean, spread, range and latency."""
import pytest
import torch
from detectron2.modeling import build_model
from detectron2.structures import BitMasks
from detectron2.utils.events import EventStorage

from fcos_d2.data import synthetic
from synthetic_samples import sample

from benchmarks.masks import cli as mq, configs as mconf


def test_contenders_share_the_regime_and_differ_only_in_the_detector():
    sipmask, rcnn = (mq.setup_cfg(name, 1, "unused", 300, []) for name in mq.CONTENDERS)
    assert mconf.shared_regime(sipmask) == mconf.shared_regime(rcnn)
    assert rcnn.MODEL.META_ARCHITECTURE == "GeneralizedRCNN" and rcnn.MODEL.MASK_ON
    assert (sipmask.DATASETS.TRAIN, sipmask.DATASETS.TEST) == \
        (("synthetic_masks_train",), ("synthetic_masks_val",))
    deepest = max(sipmask.MODEL.RESNETS.OUT_FEATURES)
    stages = ["res2", "res3", "res4", "res5"]
    assert rcnn.MODEL.RESNETS.OUT_FEATURES == stages[:stages.index(deepest) + 1]
    assert rcnn.SEED == 1 and rcnn.SOLVER.MAX_ITER == 300


def test_the_thin_regime_changes_the_data_its_classes_and_input_sizes_for_both():
    sipmask, rcnn = (mq.setup_cfg(name, 0, "unused", 300, [], regime="thin")
                     for name in mq.CONTENDERS)
    assert mconf.shared_regime(sipmask) == mconf.shared_regime(rcnn)
    assert (sipmask.DATASETS.TRAIN, sipmask.DATASETS.TEST) == \
        (("synthetic_thin_masks_train",), ("synthetic_thin_masks_val",))
    assert sipmask.MODEL.FCOS.NUM_CLASSES == rcnn.MODEL.ROI_HEADS.NUM_CLASSES == 10
    assert (sipmask.INPUT.MIN_SIZE_TRAIN, sipmask.INPUT.MAX_SIZE_TEST) == ((256,), 352)
    quickstart = mq.setup_cfg("sipmask", 0, "unused", 300, [])
    assert mconf.shared_regime(quickstart) != mconf.shared_regime(sipmask)
    with pytest.raises(ValueError, match="unknown regime 'coco'"):
        mq.setup_cfg("sipmask", 0, "unused", 10, [], regime="coco")


def test_schedule_keeps_its_fractions_when_shortened():
    cfg = mq.setup_cfg("mask-rcnn", 0, "unused", 330, [])
    base = mq.setup_cfg("mask-rcnn", 0, "unused", 3300, [])
    assert cfg.SOLVER.STEPS == tuple(round(s / 10) for s in base.SOLVER.STEPS)
    assert cfg.SOLVER.WARMUP_ITERS == round(base.SOLVER.WARMUP_ITERS / 10)
    assert cfg.TEST.EVAL_PERIOD == 0 and cfg.SOLVER.CHECKPOINT_PERIOD == 330
    with pytest.raises(ValueError, match="unknown contender 'yolact'"):
        mq.setup_cfg("yolact", 0, "unused", 10, [])


def _with_masks(split: str, index: int) -> dict:
    item = sample(split, index)
    objects = synthetic.render_image(seed=synthetic.SPLIT_SEEDS[split], index=index)[1]
    item["instances"].gt_masks = BitMasks(torch.stack(
        [torch.from_numpy(o.visible_mask) for o in objects]).reshape(-1, 128, 128))
    return item


def test_mask_rcnn_trains_with_a_mask_loss_and_returns_masks_at_the_requested_size():
    cfg = mq.setup_cfg("mask-rcnn", 0, "unused", 10, ["MODEL.FPN.OUT_CHANNELS", 32])
    torch.manual_seed(0)
    model = build_model(cfg)
    with EventStorage():
        losses = model([_with_masks("train", i) for i in (1, 2)])
    assert {"loss_mask", "loss_cls", "loss_rpn_cls"} <= set(losses)
    assert all(torch.isfinite(v) for v in losses.values())
    model.eval()
    with torch.no_grad():
        found = model([{"image": sample("val", 0)["image"], "height": 64, "width": 80}])
    masks = found[0]["instances"].pred_masks
    assert masks.dtype == torch.bool and masks.shape[1:] == (64, 80)


def test_table_reports_mask_ap_mean_spread_range_box_ap_and_latency():
    def run(name, seed, mask_ap, box_ap, status="ok"):
        return {"contender": name, "seed": seed, "status": status,
                "mask": {"AP": mask_ap, "AP50": 2 * mask_ap, "AP75": mask_ap / 2},
                "box": {"AP": box_ap}}

    results = [run("mask-rcnn", 2, 30.0, 40.0), run("mask-rcnn", 0, 20.0, 30.0),
               run("mask-rcnn", 1, 25.0, 35.0), run("sipmask", 0, 10.0, 12.0)]
    table = mq.summarise(results, {"mask-rcnn": {"median_s": 0.0425}}, list(mq.CONTENDERS))
    rows = table.splitlines()
    assert rows[3] == ("| mask-rcnn | 0,1,2 | 25.0 | 5.0 | 20.0-30.0 | 50.0 | 12.5 | 35.0 | "
                       "5.0 | 42.5 |")
    assert rows[2] == "| sipmask | 0 | 10.0 | nan | 10.0-10.0 | 20.0 | 5.0 | 12.0 | nan | n/a |"
    assert rows[1] == "|---|---|---|---|---|---|---|---|---|---|"


def test_runs_are_reused_only_under_the_same_regime_and_the_table_is_written(
        tmp_path, monkeypatch, records_dir):
    import json

    import fcos_d2.data

    key = mq.run_key(mq.setup_cfg("mask-rcnn", 0, "", 20, []))
    stale = dict(key, regime=dict(key["regime"], SEED=99))  # e.g. another schedule or seed
    rows = [{"contender": "mask-rcnn", "seed": 0, "status": "ok", **key,
             "mask": {"AP": 5.0, "AP50": 9.0, "AP75": 4.0}, "box": {"AP": 6.0}},
            {"contender": "mask-rcnn", "seed": 1, "status": "ok", **stale,
             "mask": {"AP": 50.0, "AP50": 90.0, "AP75": 40.0}, "box": {"AP": 60.0}}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    launched = []
    monkeypatch.setattr(fcos_d2.data, "prepare_dataset", lambda name: None)
    monkeypatch.setattr(mq, "run_all",
                        lambda todo, jobs, output, opts, command: launched.append((todo, opts)))
    monkeypatch.setattr(mq, "measure_latency",
                        lambda *args, **kwargs: {"mask-rcnn": {"median_s": 0.01}})
    table = mq.main(["--contenders", "mask-rcnn", "--seeds", "0", "1", "--iters", "20",
                     "--output", str(tmp_path)])  # seed 0 is reused, seed 1 runs again
    assert launched == [([("mask-rcnn", 1)], ["--iters", "20", "--regime", "quickstart"])]
    assert "| mask-rcnn | 0 | 5.0 |" in table  # the stale seed-1 row is not counted
    assert (tmp_path / "table.md").read_text() == table + "\n"
    (latency,) = [json.loads(line) for line in open(records_dir / "masks.jsonl")]
    assert latency["metrics"] == {"mask-rcnn": {"ms_per_image": 10.0}}
    assert latency["run"]["kind"] == "latency" and latency["overrides"] == []
    assert latency["run"]["mask_regime"] == "quickstart"
    assert latency["command"].startswith("python -m benchmarks.masks --contenders mask-rcnn")


def test_one_run_trains_and_reports_the_box_and_mask_scores_of_its_evaluation(
        tmp_path, monkeypatch):
    import math

    monkeypatch.setenv("FCOS_D2_DATASETS_CACHE", str(tmp_path / "cache"))
    tiny = mq.val_dataset(2)  # the first 2 val images, generated under tmp_path
    threads = torch.get_num_threads()  # run_one runs on one thread, as in its own process
    try:
        row = mq.run_one("sipmask", 0, str(tmp_path / "run"), 2,
                         ["DATASETS.TRAIN", f"('{tiny}',)", "SOLVER.IMS_PER_BATCH", 2,
                          "MODEL.FPN.OUT_CHANNELS", 32,  # every candidate: scores to rank
                          "MODEL.FCOS.INFERENCE_TH_TEST", 0.0], val_images=2)
    finally:
        torch.set_num_threads(threads)
    assert row["status"] == "ok" and row["iters"] == 2
    assert set(row["box"]) == set(row["mask"]) == {"AP", "AP50", "AP75"}
    scores = [*row["box"].values(), *row["mask"].values()]
    assert all(math.isfinite(v) for v in scores), row
    assert row["regime"]["DATASETS"] == [[tiny], [tiny]]
    assert (tmp_path / "run" / "inference" / tiny / "summary.txt").is_file()


def test_one_thin_run_trains_on_the_thin_masks_and_says_its_regime(tmp_path, monkeypatch):
    monkeypatch.setenv("FCOS_D2_DATASETS_CACHE", str(tmp_path / "cache"))
    tiny = mq.val_dataset(2, "thin")  # the first 2 thin val images, with masks
    assert tiny == "synthetic_thin_masks_val_first_2"
    threads = torch.get_num_threads()
    try:
        row = mq.run_one("sipmask", 0, str(tmp_path / "run"), 2,
                         ["DATASETS.TRAIN", f"('{tiny}',)", "SOLVER.IMS_PER_BATCH", 2,
                          "MODEL.FPN.OUT_CHANNELS", 32, "MODEL.FCOS.INFERENCE_TH_TEST", 0.0],
                         val_images=2, regime="thin")
    finally:
        torch.set_num_threads(threads)
    assert row["status"] == "ok" and row["mask_regime"] == "thin"
    assert row["regime"]["DATASETS"] == [[tiny], [tiny]]
    assert row["regime"]["INPUT"][:4] == [[256], 352, 256, 352]
    assert "loss_mask" in row["final_losses"] or any("mask" in k for k in row["final_losses"])
    assert all(0.0 <= v <= 100.0 for v in row["mask"].values()), row["mask"]


def test_zero_latency_images_times_nothing_and_builds_no_model(tmp_path, monkeypatch):
    weights = tmp_path / "runs" / "sipmask-0" / "model_final.pth"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"")  # a seed-0 model is there: only num_images decides

    def no_config(*args, **kwargs):
        raise AssertionError("a model was set up although no image is to be timed")

    monkeypatch.setattr(mq, "setup_cfg", no_config)
    assert mq.measure_latency(["sipmask"], tmp_path, 20, [], 0) == {}
    with pytest.raises(AssertionError, match="no image is to be timed"):
        mq.measure_latency(["sipmask"], tmp_path, 20, [], 1)
    run = {"contender": "sipmask", "seed": 0, "status": "ok", "box": {"AP": 60.0},
           "mask": {"AP": 50.0, "AP50": 90.0, "AP75": 40.0}}
    assert mq.summarise([run], {}, ["sipmask"]).endswith("| 60.0 | nan | n/a |")


def test_a_run_of_another_model_option_is_not_reused():
    plain = mq.run_key(mq.setup_cfg("sipmask", 0, "", 20, []))
    other = mq.run_key(mq.setup_cfg("sipmask", 0, "", 20, ["MODEL.FCOS.CLS_LOSS", "focal"]))
    assert plain["regime"] == other["regime"]  # the shared part is the same ...
    assert plain["model"] != other["model"]  # ... but the model is not: it runs again


def test_mask_rcnn_is_reused_across_sipmask_options_but_not_its_own():
    def key(*opts):
        return mq.run_key(mq.setup_cfg("mask-rcnn", 0, "", 20, list(opts)))

    plain = key()
    assert key("MODEL.FCOS.CLS_LOSS", "focal", "MODEL.SIPMASK.BASIS_IN_FEATURE", "p3") == plain
    for opts in (["MODEL.ROI_MASK_HEAD.NUM_CONV", 2], ["MODEL.FCOS.CPU_BF16", "always"],
                 ["MODEL.FCOS.COMPILE", True]):  # read by Mask R-CNN or by train_net
        assert key(*opts)["model"] != plain["model"], opts


def test_the_model_digest_does_not_depend_on_which_lists_the_config_shares():
    cfg = mq.setup_cfg("mask-rcnn", 0, "", 20, [])
    own, shared = cfg.clone(), cfg.clone()
    own.defrost()
    shared.defrost()
    own.MODEL.FPN.IN_FEATURES = list(own.MODEL.RESNETS.OUT_FEATURES)  # equal lists ...
    shared.MODEL.FPN.IN_FEATURES = shared.MODEL.RESNETS.OUT_FEATURES  # ... or one, twice
    assert own.MODEL.dump() != shared.MODEL.dump()  # yacs writes the second as an alias ...
    assert mconf.model_digest(own) == mconf.model_digest(shared)  # ... the digest sees the values
