"""The backends-ap row of benchmarks.speed: a trained model's box AP under each
MODEL.FCOS.INFERENCE_BACKEND through --eval-only's code path, its difference to eager fp32,
skipped backends recorded with the reason, the options it needs, and its table."""
import json
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.modeling import build_model

from benchmarks import records, tables
from benchmarks.speed import backends_ap_row as ap_row, cli
from fcos_d2 import add_fcos_config
from fcos_d2.data import register_coco_dataset, synthetic

REPO = Path(__file__).resolve().parents[2]
TOY = "backends_ap_toy"  # six synthetic shapes images: two pass int8's 4 calibration images
LABELS = 30  # the toy's boxes: the eager model's 30 most confident detections


def _tiny_cfg(test_set: str):
    """The quickstart config at a 32-channel head with one conv a tower, every score kept,
    tested on ``test_set``."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart.yaml"))
    cfg.merge_from_list(["MODEL.FPN.OUT_CHANNELS", 32, "MODEL.FCOS.NUM_CONVS", 1,
                         "MODEL.FCOS.INFERENCE_TH_TEST", 0.0, "MODEL.FCOS.PRE_NMS_TOPK_TEST", 50,
                         "DATASETS.TEST", (test_set,), "MODEL.DEVICE", "cpu"])
    return cfg


def _hand_set(model) -> None:
    """Random weights that give boxes of a few strides and spread scores: the head's convs
    N(0, 0.2), the regression's bias 1.5 (strides from the location)."""
    with torch.no_grad():
        for name in ("cls_tower.0", "bbox_tower.0", "cls_logits", "bbox_pred", "centerness"):
            model.head.get_submodule(name).weight.normal_(0.0, 0.2)
        model.head.bbox_pred.bias.fill_(1.5)


def _label_with_detections(model, cfg, raw: str, annotations: dict) -> dict:
    """``annotations`` with its boxes replaced by ``model``'s ``LABELS`` most confident
    detections on dataset ``raw``'s images: one score threshold for all images, so that
    every label outranks every other detection and the model scores AP 100 on them."""
    from fcos_d2.engine.trainer import Trainer

    found = []
    with torch.no_grad():
        for [inputs] in Trainer.build_test_loader(cfg, raw):
            got = model([inputs])[0]["instances"]
            found += [(float(s), inputs["image_id"], int(c), b.tolist()) for s, c, b in
                      zip(got.scores, got.pred_classes, got.pred_boxes.tensor)]
    found.sort(key=lambda item: -item[0])
    # set by the loader's first DatasetCatalog.get (0-based classes to the file's ids)
    to_id = {v: k for k, v in MetadataCatalog.get(raw).thing_dataset_id_to_contiguous_id.items()}
    boxes = [{"id": i + 1, "image_id": image, "category_id": to_id[c], "iscrowd": 0,
              "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0)}
             for i, (_, image, c, (x0, y0, x1, y1)) in enumerate(found[:LABELS])]
    return {**annotations, "annotations": boxes}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """(config file, weights file): ``_tiny_cfg(TOY)`` and its hand-set weights, where TOY
    holds six synthetic shapes images labelled with the model's own most confident
    detections (eager fp32 scores AP 100 there; a backend loses AP where it disagrees)."""
    folder = tmp_path_factory.mktemp("backends_ap")
    raw = TOY + "_images"
    synthetic.write_split(folder / "toy", split="val", num_images=6)
    if raw not in DatasetCatalog.list():
        register_coco_dataset(raw, str(folder / "toy" / "annotations.json"),
                              str(folder / "toy" / "images"))
    cfg = _tiny_cfg(TOY)
    torch.manual_seed(0)
    model = build_model(cfg)
    _hand_set(model)
    labels = _label_with_detections(model.eval(), _tiny_cfg(raw), raw, json.loads(
        (folder / "toy" / "annotations.json").read_text()))
    (folder / "labels.json").write_text(json.dumps(labels))
    if TOY not in DatasetCatalog.list():
        register_coco_dataset(TOY, str(folder / "labels.json"), str(folder / "toy" / "images"))
    weights = folder / "model.pth"
    torch.save({"model": model.state_dict()}, weights)
    config = folder / "tiny.yaml"
    config.write_text(cfg.dump())
    return str(config), str(weights)


def test_the_row_runs_only_when_named_and_says_which_models_to_pass(capsys, tmp_path):
    assert "backends-ap" not in cli.parse_args([]).rows.split(",")
    with pytest.raises(SystemExit) as stop:
        cli.parse_args(["--rows", "backends-ap"])
    assert stop.value.code != 0
    assert "--ap-model CONFIG WEIGHTS" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse_args(["--rows", "backends-ap", "--ap-model", "configs/quickstart.yaml",
                        str(tmp_path / "absent.pth")])
    assert f"no such file ['{tmp_path / 'absent.pth'}']" in capsys.readouterr().err
    args = cli.parse_args(["--rows", "loader"])  # no --ap-model
    with pytest.raises(SystemExit) as stop:  # called without models, the row says the same
        ap_row.row(args)
    assert stop.value.code == 2 and "--ap-model CONFIG WEIGHTS" in capsys.readouterr().out


def test_a_backend_this_cpu_cannot_run_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr(ap_row, "cpu_capabilities",
                        lambda: {"native_bf16": False, "native_int8": True})
    monkeypatch.setattr(ap_row, "torchao_available", lambda: False)
    assert ap_row.skip_reason("eager", emulated_ok=False) == ""
    assert "no native bf16" in ap_row.skip_reason("bf16_compiled", emulated_ok=False)
    assert ap_row.skip_reason("bf16_compiled", emulated_ok=True) == ""
    assert ap_row.precision("bf16_compiled") == "emulated"
    assert ap_row.precision("auto") == ""  # auto runs fp32 without native bf16 ...
    assert ap_row.skip_reason("auto", emulated_ok=False) == ""  # ... so it is never skipped
    monkeypatch.setattr(ap_row, "cpu_capabilities",
                        lambda: {"native_bf16": True, "native_int8": True})
    assert ap_row.precision("auto") == "native"  # and native bf16 where there is some
    assert "pip install torchao" in ap_row.skip_reason("int8_pt2e", emulated_ok=True)


def test_records_hold_each_backends_ap_less_eagers_and_keep_the_skipped(monkeypatch, tiny_model,
                                                                       tmp_path):
    """The evaluation replaced by fixed scores: the records' arithmetic, by hand."""
    config, weights = tiny_model
    scores = {"eager": 50.0, "int8_pt2e": 49.25, "auto": 50.5}
    evaluated = []

    def fake_evaluate(cfg):
        evaluated.append((cfg.MODEL.FCOS.INFERENCE_BACKEND, cfg.MODEL.WEIGHTS, cfg.OUTPUT_DIR))
        ap = scores[cfg.MODEL.FCOS.INFERENCE_BACKEND]
        return {TOY: {"bbox": {"AP": ap, "AP50": ap + 20}}}, 2.04

    monkeypatch.setattr(ap_row, "evaluate", fake_evaluate)
    monkeypatch.setattr(ap_row, "skip_reason",
                        lambda backend, ok: "no bf16 here" if backend == "bf16_compiled" else "")
    got = ap_row.model_records(config, weights, tmp_path, emulated_ok=False)
    assert [b for b, _, _ in evaluated] == ["eager", "int8_pt2e", "auto"]
    assert evaluated[1][1:] == (weights, str(tmp_path / "tiny" / "int8_pt2e"))
    eager, bf16, int8, auto = got
    assert auto["AP_minus_eager"] == 0.5 and auto["auto_choice"].startswith(
        "MODEL.FCOS.INFERENCE_BACKEND auto: ")
    assert eager["AP_minus_eager"] == 0.0 and eager["precision"] == "fp32"
    assert bf16 == {"row": "backends-ap", "model": config, "weights": weights,
                    "backend": "bf16_compiled", "skipped": "no bf16 here"}
    assert (int8["AP"], int8["AP50"], int8["AP_minus_eager"]) == (49.25, 69.25, -0.75)
    assert (int8["eval_seconds"], int8["images"], int8["calibration_images"]) == (2.0, 6, 4)
    assert ap_row.targets(got) == {
        f"int8_pt2e AP - eager fp32 AP, tiny.yaml on {TOY} (target: within 1.0)": -0.75,
        f"auto AP - eager fp32 AP, tiny.yaml on {TOY} (target: within 0.1)": 0.5}


def test_the_row_evaluates_every_backend_through_eval_only_and_is_tabled(tiny_model, tmp_path,
                                                                         records_dir):
    config, weights = tiny_model
    torch.set_num_threads(1)
    cli.main(["--rows", "backends-ap", "--ap-model", config, weights, "--threads", "1",
              "--ap-output", str(tmp_path / "out"), "--json", str(tmp_path / "b.json")])
    [(line, record)] = records.read_numbered_records(records_dir / "speed.jsonl")
    got = {r["backend"]: r for r in record["metrics"]["rows"]["backends-ap"]}
    assert list(got) == list(ap_row.BACKENDS)
    eager = got["eager"]
    assert eager["AP_minus_eager"] == 0.0 and eager["images"] == 6
    assert eager["AP"] >= 99.0  # its own detections: every label found first (see _label...)
    assert got["auto"]["auto_choice"].startswith("MODEL.FCOS.INFERENCE_BACKEND auto: ")
    for backend, r in got.items():
        if "skipped" in r:  # this CPU lacks the backend: the reason is the result
            assert r["skipped"] == ap_row.skip_reason(backend, False) != ""
            continue
        assert r["AP_minus_eager"] == pytest.approx(r["AP"] - eager["AP"], abs=2e-3)
        assert 0 <= r["AP50"] <= 100 and r["eval_seconds"] > 0
        # --eval-only's trainer wrote its summary for this backend's evaluation
        assert (tmp_path / "out" / "tiny" / backend / "inference" / TOY / "summary.txt").is_file()
    assert record["run"]["options"]["ap_models"] == [[config, weights]]
    assert record["run"]["options"]["ap_register_coco"] == []
    table = "\n".join(tables.speed_table([(line, record)]))
    assert "Box AP per MODEL.FCOS.INFERENCE_BACKEND" in table
    assert f"| {config} | {weights} | {TOY} | eager | fp32 | {eager['AP']:.2f} |" in table
    assert "int8_pt2e AP - eager fp32 AP, tiny.yaml" in table or "skipped" in got["int8_pt2e"]


def test_the_row_registers_the_coco_test_sets_it_is_given(dataset):
    name = "backends_ap_registered"  # conftest's 4 synthetic shapes images
    args = cli.parse_args(["--ap-register-coco", name, str(dataset / "annotations.json"),
                           str(dataset / "images")])
    ap_row.register_datasets(args.ap_register_coco)
    assert len(DatasetCatalog.get(name)) == 4
    ap_row.register_datasets(args.ap_register_coco)  # again: left as it is (no re-register error)
