"""The entry row of benchmarks.speed (INFERENCE_BACKEND auto through its entry points against
torchvision fp32): its test set, its log parser, its ratios, its options and its record; the
timings themselves are its output."""
import logging
import os
from pathlib import Path

import pytest
from PIL import Image

from benchmarks.speed import cli, entry_data, entry_predictor, entry_row, entry_runs
from fcos_d2.modeling import compile_cache
from fcos_d2.modeling.backend_choice import choose_backend

SECONDS = {"tv_loop": 100.0, "tv_median": 2.0, "eval_cold": 30.0, "eval_warm": 20.0,
           "eval_warm_compile": 12.0, "predictor_median": 0.25, "fresh_build": 4.0,
           "fresh_first": 0.75, "fresh_steady": 0.25}


def test_the_test_set_is_coco_json_with_boxes_on_every_image_of_the_asked_size(tmp_path):
    from pycocotools.coco import COCO

    json_file, image_dir = entry_data.write_dataset(tmp_path, 2, 64, 96, num_classes=3)
    coco = COCO(str(json_file))
    assert sorted(coco.getCatIds()) == [1, 2, 3] and len(coco.getImgIds()) == 2
    for image in coco.loadImgs(coco.getImgIds()):
        assert (image["height"], image["width"]) == (64, 96)
        assert Image.open(image_dir / image["file_name"]).size == (96, 64)  # (W, H)
        boxes = [a["bbox"] for a in coco.loadAnns(coco.getAnnIds(imgIds=image["id"]))]
        assert len(boxes) == entry_data.BOXES_PER_IMAGE
        for x, y, w, h in boxes:  # inside the image, 1/8 to 1/3 of each side
            assert 0 <= x and x + w <= 96 and 0 <= y and y + h <= 64
            assert 96 // 8 <= w <= 96 // 3 and 64 // 8 <= h <= 64 // 3


def test_the_parser_reads_autos_line_and_a_compiles_seconds_from_a_hand_written_log():
    log = ("[12/06 10:00:01 d2.data.build]: Distribution of instances ...\n"
           "[12/06 10:00:02 fcos_d2.modeling.meta_arch]: MODEL.FCOS.INFERENCE_BACKEND auto: "
           "bf16_compiled (native bf16: AMX; 50 images ahead, the compile cache holds this "
           "model: the compile pays)\n"
           "[12/06 10:00:02 fcos_d2.modeling.compile_cache]: Compiling backbone and head for "
           "input 800x1216 (torch.compile, bf16): expect about 95 s (its last compile ...)\n"
           "[12/06 10:00:14 fcos_d2.modeling.compile_cache]: Backbone and head loaded from "
           "the cache in 12.5 s (inductor cache: 3 hits, 0 misses)\n")
    parsed = entry_runs.parse_log(log)
    assert parsed["auto"] == ("MODEL.FCOS.INFERENCE_BACKEND auto: bf16_compiled (native bf16: "
                              "AMX; 50 images ahead, the compile cache holds this model: the "
                              "compile pays)")
    assert parsed["compiles"] == [("loaded from the cache", 12.5)]
    assert parsed["compile_s"] == 12.5 and parsed["expected_s"] == [95.0]
    eager = entry_runs.parse_log("\x1b[31mWARNING\x1b[0m [x]: MODEL.FCOS.INFERENCE_BACKEND "
                                 "auto: eager float32, since ...\n")
    assert eager == {"auto": "MODEL.FCOS.INFERENCE_BACKEND auto: eager float32, since ...",
                     "compiles": [], "compile_s": 0, "expected_s": []}


def test_the_parser_reads_the_lines_fcos_d2_logs(caplog):
    choice = choose_backend("auto", "cpu", 50, warm=True, environ={},
                            capabilities={"amx": True, "native_bf16": True})
    with caplog.at_level(logging.INFO):
        logging.getLogger("fcos_d2.modeling.meta_arch").info(choice.reason)
        start = compile_cache.log_compile_start((1, 3, 800, 1216), (95.0, "cached"),
                                                compile_cache.cache_root("/tmp/x"))
        compile_cache.log_compile_end(start - 2.0, 0, 33)
    parsed = entry_runs.parse_log(caplog.text)
    assert parsed["auto"] == choice.reason and "bf16_compiled" in parsed["auto"]
    assert [how for how, _ in parsed["compiles"]] == ["compiled"]
    assert 2.0 <= parsed["compile_s"] < 60 and parsed["expected_s"] == [95.0]


def test_the_ratios_divide_the_issues_pairs():
    targets = entry_row.entry_targets(SECONDS, 50, (800, 1216))
    assert list(targets.values()) == pytest.approx([0.3, 0.2, 12.0, 0.125, 3.0])
    assert all("R-50 800x1216, 50 images" in name for name in targets)
    assert "(R-50 800x1216, 50 images; target <= 0.3)" in list(targets)[0]


def test_entry_runs_only_when_named_and_takes_its_size_and_image_count():
    assert "entry" not in cli.parse_args([]).rows.split(",")
    args = cli.parse_args(["--rows", "entry", "--entry-images", "2", "--entry-size", "128x192"])
    assert (args.entry_images, entry_row.entry_size(args)) == (2, (128, 192))
    assert entry_row.entry_size(cli.parse_args(["--rows", "entry", "--quick"])) == (512, 768)
    assert entry_row.entry_size(cli.parse_args(["--rows", "entry"])) == (800, 1216)
    argv = ["--rows", "entry", "--entry-images", "2"]
    record = cli.run_record({"machine": {}, "rows": {}, "targets": {}}, cli.parse_args(argv),
                            argv, 1.0)
    assert record["run"]["options"]["entry_images"] == 2
    assert record["run"]["options"]["entry_size"] == [800, 1216]


def test_images_keep_their_size_in_the_eval_command_and_the_predictor():
    cfg = entry_predictor.fcos_cfg()  # configs/FCOS-R50.yaml: test resize 800 / 1333
    assert entry_predictor.size_overrides(cfg, 800, 1216) == []
    assert entry_predictor.size_overrides(cfg, 128, 192) == [
        "INPUT.MIN_SIZE_TEST", "128", "INPUT.MAX_SIZE_TEST", "192"]
    overrides = entry_predictor.shared_overrides("w.pth", "cache", (800, 1216))
    assert overrides == ["MODEL.WEIGHTS", "w.pth", "MODEL.DEVICE", "cpu",
                         "MODEL.FCOS.COMPILE_CACHE_DIR", "cache"]  # the backend: auto
    command = entry_runs.eval_only_command(("a.json", "images"), overrides, "out")
    assert command[1:5] == ["train_net.py", "--config-file", str(entry_predictor.CONFIG),
                            "--eval-only"]
    assert command[-4:] == ["DATASETS.TEST", "('entry_benchmark',)", "OUTPUT_DIR", "out"]
    env = entry_runs.subprocess_env(3, Path("/c"))
    assert (env["OMP_NUM_THREADS"], env["TORCHINDUCTOR_CACHE_DIR"]) == ("3", "/c/inductor")


def test_the_record_holds_the_seconds_choices_and_targets_and_feeds_the_run_targets(capsys):
    logs = {name: entry_runs.parse_log("MODEL.FCOS.INFERENCE_BACKEND auto: eager float32")
            for name in ("eval_cold", "predictor", "eval_warm", "fresh")}
    args = cli.parse_args(["--rows", "entry", "--threads", "2"])
    [record] = entry_row.row(args, {"seconds": SECONDS, "logs": logs})
    assert record["raw_seconds"] == SECONDS and record["threads"] == 2
    assert set(record["auto_choice"]) == set(logs) and record["bf16"] in (
        "native", "emulated", "unknown")
    assert record["targets"] == entry_row.entry_targets(SECONDS, 50, (800, 1216))
    out = capsys.readouterr().out
    assert "0.300x the loop" in out and "0.125x torchvision's median" in out and "3.00x" in out
    ratios = cli.target_ratios({"entry": [record]}, "cpu", "bf16 native")
    assert ratios == record["targets"]
    cuda = cli.parse_args(["--rows", "entry", "--device", "cuda"])
    assert entry_row.row(cuda) == [{"row": "entry", "skipped": "the entry row measures the "
                                                               "CPU's default backend"}]


def test_a_collected_log_restores_the_environment_and_the_logger_level(monkeypatch):
    monkeypatch.delenv("FCOS_D2_CACHE_DIR", raising=False)
    logger = logging.getLogger("fcos_d2")
    level, lines = logger.level, []
    with entry_runs.fcos_d2_log(lines, {"FCOS_D2_CACHE_DIR": "/c"}):
        logging.getLogger("fcos_d2.modeling.meta_arch").info("said")
        assert os.environ["FCOS_D2_CACHE_DIR"] == "/c"
    assert lines == ["said"] and logger.level == level
    assert "FCOS_D2_CACHE_DIR" not in os.environ
