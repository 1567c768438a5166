"""benchmarks.speed's machinery (the timings themselves are its output, not tested):
interleaved timing, the target ratios, row selection, --device cuda without a GPU, and the
record of a run."""
import json
import shutil

import pytest
import torch

from benchmarks.speed import compile_row, contenders as bc, labelenc_row, loader_row


@pytest.fixture(scope="module")
def benchmark():
    from benchmarks.speed import cli

    return cli


def test_contenders_are_timed_in_turn_after_a_warm_up(benchmark):
    calls = []
    medians = benchmark.interleaved_medians({"a": lambda: calls.append("a"),
                                             "b": lambda: calls.append("b")}, 3, "cpu")
    assert calls == ["a", "b"] * 4  # one warm-up round, then 3 timed rounds
    assert set(medians) == {"a", "b"} and all(t >= 0 for t in medians.values())


def _rows(tag: str):
    inference = [{"row": "inference", "contender": c, "batch": b, "seconds": t}
                 for c, b, t in [("fcos-d2 fp32", 1, 2.4),
                                 ("fcos-d2 fp32 FAST_INFERENCE off", 1, 3.0),
                                 ("torchvision fp32", 1, 4.0), (f"fcos-d2 {tag}", 1, 1.2),
                                 ("torchvision fp32", 4, 99.0)]]
    training = [{"row": "training", "contender": c, "batch": 2, "seconds": t}
                for c, t in [("fcos-d2 fp32", 6.0), ("torchvision fp32", 8.0),
                             (f"fcos-d2 {tag} +CL", 3.0)]]
    return {"inference": inference, "training": training, "flops": [{"floor_seconds": 2.0}],
            "loader": [{"targets": {"loader (target >= 0.95)": 0.97}}]}


def test_target_ratios_divide_the_named_rows(benchmark):
    ratios = benchmark.target_ratios(_rows("bf16 native"), "cpu", "bf16 native")
    assert list(ratios.values()) == pytest.approx([2.4 / 4.0, 1.2 / 2.4, 2.4 / 2.0,
                                                   6.0 / 8.0, 3.0 / 6.0, 0.97])
    assert "inference bf16 native / fcos-d2 fp32 (target <= 0.55)" in ratios


def test_emulated_bf16_ratios_are_no_result_and_left_out(benchmark, capsys):
    ratios = benchmark.target_ratios(_rows("bf16 emulated"), "cpu", "bf16 emulated")
    assert not any("bf16" in name for name in ratios)
    assert list(ratios.values()) == pytest.approx([2.4 / 4.0, 2.4 / 2.0, 6.0 / 8.0, 0.97])
    assert "bf16 emulated: its ratios are no result" in capsys.readouterr().out


def test_an_unknown_row_is_rejected_naming_the_option(benchmark, capsys):
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--rows", "inference,speed"])
    assert "--rows: unknown ['speed']" in capsys.readouterr().err


def test_device_cuda_without_a_gpu_prints_why_and_writes_the_reason(benchmark, tmp_path, capsys,
                                                                    records_dir):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: --device cuda would run the whole benchmark")
    benchmark.main(["--device", "cuda", "--json", str(tmp_path / "b.json")])
    assert "skipped: --device cuda: CUDA is not available" in capsys.readouterr().out
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["rows"] == {} and "CUDA is not available" in report["skipped"]
    assert not (records_dir / "speed.jsonl").exists()  # nothing measured: no record


def test_a_run_is_recorded_with_its_rows_targets_options_and_command(benchmark):
    argv = ["--rows", "loader", "--repeats", "1", "--threads", "1"]
    args = benchmark.parse_args(argv)
    report = {"machine": {"cpu": "a CPU", "torch_threads": 1}, "targets": {"t (<= 1)": 0.5},
              "rows": {"loader": [{"row": "loader", "contender": "fcos-d2", "seconds": 2.0}]}}
    record = benchmark.run_record(report, args, argv, 12.34)
    assert record["benchmark"] == "speed" and record["seed"] == 0
    assert record["metrics"] == {"rows": report["rows"], "targets": {"t (<= 1)": 0.5}}
    assert record["times"] == {"total_seconds": 12.3} and record["overrides"] == []
    assert record["command"] == "python -m benchmarks.speed --rows loader --repeats 1 --threads 1"
    assert record["run"]["options"] == {"rows": ["loader"], "repeats": 1, "quick": False,
                                        "inference_batches": [1, 4], "threads": 1}
    assert record["run"]["machine"] == report["machine"]


def test_loader_row_times_both_mappers_on_jpegs_with_boxes(benchmark):
    result = loader_row.mapper_throughput(images=2, repeats=1, size=(64, 96))
    assert result["fcos-d2"] > 0 and result["detectron2"] > 0
    assert result["ratio"] == pytest.approx(result["fcos-d2"] / result["detectron2"])


def test_compile_row_says_why_it_skips_without_a_cpp_compiler(benchmark, monkeypatch, capsys):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    rows = compile_row.row(benchmark.parse_args(["--rows", "compile"]), None, None,
                                 (64, 96))
    assert rows == [{"row": "compile", "skipped": "no C++ compiler (c++, g++ or clang++) on "
                                                  "PATH: inductor needs one on the CPU"}]
    assert "skipped: no C++ compiler" in capsys.readouterr().out


def test_compile_row_compares_training_losses_and_gradients(benchmark):
    torch.manual_seed(0)
    eager = bc.fcos_d2_contender("cpu")
    same = bc.fcos_d2_contender("cpu")
    same.model.load_state_dict(eager.model.state_dict())
    images, targets = bc.random_images(1, 64, 96, "cpu"), bc.random_targets(1, 3, 64, 96, "cpu")
    equal = compile_row._training_differences(eager, same, images, targets)
    assert equal.keys() == {"training_loss_rel_diff", "training_grad_max_abs_diff_over_largest"}
    assert all(value <= 1e-6 for value in equal.values())  # threads may sum in another order
    with torch.no_grad():
        same.model.head.cls_logits.bias += 1.0  # another model: another loss
    differ = compile_row._training_differences(eager, same, images, targets)
    assert differ["training_loss_rel_diff"] > 1e-3
    assert differ["training_grad_max_abs_diff_over_largest"] > 1e-3
    assert all(p.grad is None or not p.grad.any() for p in eager.model.parameters())


def test_labelenc_row_times_the_stripped_step2_model_against_plain_fcos(benchmark):
    args = benchmark.parse_args(["--rows", "labelenc", "--repeats", "1"])
    rows = labelenc_row.row(args, benchmark.interleaved_medians,
                            benchmark.backbone_head_macs, (64, 96))
    assert [r["contender"] for r in rows] == ["plain FCOS-R50", "LabelEnc step 2's FCOS-R50"]
    plain, labelenc = rows
    assert labelenc["parameters"] == plain["parameters"]
    assert labelenc["gmacs"] == plain["gmacs"] > 0
    assert labelenc["seconds"] > 0 and plain["latency_vs_plain"] == 1.0


def test_the_ways_detectron2_users_call_the_model_have_their_target(benchmark):
    rows = _rows("bf16 native")
    rows["inference"] += [{"row": "inference", "contender": c, "batch": 1, "seconds": t}
                          for c, t in [("fcos-d2 fp32 build_model + eval()", 2.8),
                                       ("fcos-d2 fp32 DefaultPredictor", 3.2)]]
    ratios = benchmark.target_ratios(rows, "cpu", "bf16 native")
    assert ratios["inference fp32 build_model + eval() / torchvision fp32 (target <= 0.75)"] \
        == pytest.approx(0.7)
    assert ratios["inference fp32 DefaultPredictor / torchvision fp32 (target <= 0.75)"] \
        == pytest.approx(0.8)


def test_the_default_predictor_and_eval_mode_contenders_detect_like_the_model():
    import torch
    from benchmarks.speed import contenders as bc

    images = bc.random_images(2, 64, 96, "cpu").round()  # what uint8 arrays hold
    torch.manual_seed(0)
    by_hand = bc.fcos_d2_eval_mode_infer("cpu", INFERENCE_TH_TEST=0.0)  # random weights
    torch.manual_seed(0)  # the same random weights
    predictor = bc.default_predictor_infer("cpu", (64, 96), INFERENCE_TH_TEST=0.0)
    with torch.no_grad():
        eval_mode, predicted = by_hand(images), predictor(images)
    assert len(eval_mode) == len(predicted) == 2
    for mine, theirs in zip(eval_mode, predicted):
        mine, theirs = mine["instances"], theirs["instances"]
        assert tuple(theirs.image_size) == (64, 96)  # kept at the contenders' size
        assert len(mine) == len(theirs) > 0
        assert torch.allclose(mine.scores, theirs.scores, atol=1e-5)
        assert torch.allclose(mine.pred_boxes.tensor, theirs.pred_boxes.tensor, atol=1e-3)
