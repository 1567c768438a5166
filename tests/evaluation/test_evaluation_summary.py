"""The readable evaluation report: summary blocks and the EXPECTED_RESULTS verdict."""
import datetime
import math

from detectron2.utils.events import EventStorage

from fcos_d2.evaluation import (append_summaries, append_summary, expected_results_verdict,
                                format_summary, iterations_trained, summary_path)

NOON = datetime.datetime(2024, 6, 1, 12, 0, 0)
BBOX = {"AP": 52.13, "AP50": 80.0, "AP75": 55.5, "APs": 40.0, "APm": 60.25, "APl": 71.0,
        "AP-circle": 61.0, "AP-triangle": 43.25}


def test_summary_block_lists_iteration_coco_metrics_and_per_category_ap():
    assert format_summary("shapes_val", BBOX, 200, time=NOON) == (
        "== shapes_val | iterations trained: 200 | 2024-06-01 12:00:00 ==\n"
        "      AP   AP50   AP75    APs    APm    APl\n"
        "   52.13  80.00  55.50  40.00  60.25  71.00\n"
        "  AP per category:\n"
        "    circle    61.00\n"
        "    triangle  43.25\n"
        "\n")


def test_summary_of_weights_without_iteration_and_of_empty_results_says_so():
    block = format_summary("d", {"AP": math.nan}, None, time=NOON)
    assert block.splitlines() == ["== d | iterations trained: unknown | 2024-06-01 12:00:00 ==",
                                  "      AP   AP50   AP75    APs    APm    APl",
                                  "     nan    nan    nan    nan    nan    nan", ""]


def test_summary_of_another_model_than_pytorchs_names_it_after_the_iterations(tmp_path):
    block = format_summary("d", BBOX, None, time=NOON, model="ONNX fcos.onnx")
    assert block.splitlines()[0] == (
        "== d | iterations trained: unknown | model: ONNX fcos.onnx | 2024-06-01 12:00:00 ==")
    append_summaries(str(tmp_path), ["d"], {"bbox": BBOX}, None, model="ONNX fcos.onnx")
    assert "| model: ONNX fcos.onnx |" in open(summary_path(str(tmp_path), "d")).read()


def test_append_summary_adds_one_block_per_evaluation_in_order(tmp_path):
    path = append_summary(str(tmp_path), "shapes_val", BBOX, 100)
    assert append_summary(str(tmp_path), "shapes_val", BBOX, 200) == path
    assert path == str(tmp_path / "inference" / "shapes_val" / "summary.txt")
    assert path == summary_path(str(tmp_path), "shapes_val")
    headers = [line for line in open(path).read().splitlines() if line.startswith("==")]
    assert [h.split(" | ")[1] for h in headers] == ["iterations trained: 100",
                                                    "iterations trained: 200"]


def test_summaries_go_to_each_dataset_of_nested_or_single_dataset_results(tmp_path):
    append_summaries(str(tmp_path), ["a"], {"bbox": BBOX}, 1)  # one dataset: not nested
    append_summaries(str(tmp_path), ["a", "b"], {"a": {"bbox": BBOX}, "b": {}}, 2)
    assert open(summary_path(str(tmp_path), "a")).read().count("== a | iterations") == 2
    assert not (tmp_path / "inference" / "b").exists()  # no box results: no summary


def test_iterations_trained_counts_finished_iterations_of_the_running_training():
    assert iterations_trained(max_iter=100) is None  # no training running
    with EventStorage(start_iter=49):  # a periodic evaluation, after iteration 49
        assert iterations_trained(max_iter=100) == 50
    with EventStorage(start_iter=100):  # the final one: detectron2 sets storage.iter = 100
        assert iterations_trained(max_iter=100) == 100


def test_verdict_passes_when_every_metric_is_within_its_tolerance():
    verdict = expected_results_verdict([["bbox", "AP", 50.0, 2.5]], {"bbox": BBOX})
    assert verdict == "TEST.EXPECTED_RESULTS: PASS: bbox/AP = 52.1300 (expected 50.0 +- 2.5)"


def test_verdict_fails_on_a_metric_out_of_range_missing_or_nan():
    verdict = expected_results_verdict(
        [["bbox", "AP", 50.0, 2.5], ["bbox", "AP50", 90.0, 1.0], ["bbox", "APx", 1.0, 1.0],
         ["bbox", "APl", 1.0, 1.0]],
        {"bbox": dict(BBOX, APl=math.nan)})
    assert verdict.startswith("TEST.EXPECTED_RESULTS: FAIL: bbox/AP = 52.1300 (expected 50.0 "
                              "+- 2.5); bbox/AP50 = 80.0000 (expected 90.0 +- 1.0) <- out of "
                              "range; bbox/APx = missing")
    assert verdict.endswith("bbox/APl = nan (expected 1.0 +- 1.0) <- out of range")
