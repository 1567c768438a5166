"""The backends row of benchmarks.speed (MODEL.FCOS.INFERENCE_BACKEND against torchvision
fp32): its options and its CPU-only rule; the timings themselves are its output."""
from benchmarks.speed import backends_row, cli


def test_backends_row_takes_its_size_and_is_skipped_off_the_cpu():
    args = cli.parse_args(["--rows", "backends", "--device", "cuda", "--backends-size", "64x96"])
    assert args.backends_size == "64x96"
    assert backends_row.row(args, None, (64, 96), "") == [
        {"row": "backends", "skipped": "the inference backends are CPU paths"}]


def test_agreement_counts_fp32_detections_found_with_same_class_and_close_corners():
    import torch
    from detectron2.structures import Boxes, Instances

    def instances(boxes, classes):
        result = Instances((100, 100))
        result.pred_boxes, result.pred_classes = Boxes(torch.tensor(boxes)), torch.tensor(classes)
        return result

    want = instances([[0., 0., 10., 10.], [20., 20., 40., 40.], [50., 50., 60., 60.]], [0, 1, 2])
    # first: 3 px off (found); second: other class (missed); third: 5 px off (missed)
    got = instances([[3., 0., 10., 10.], [20., 20., 40., 40.], [55., 50., 60., 60.]], [0, 2, 2])
    assert backends_row._found(got, want) == 1


def test_backends_are_timed_at_the_configured_threshold_after_agreeing_at_zero(monkeypatch):
    built = []

    def eager_model(backend, state_dict):  # every backend eager: no compiling in a test
        model = original_model("eager", state_dict)
        built.append(model)
        return model

    original_model = backends_row._model
    monkeypatch.setattr(backends_row, "_model", eager_model)
    monkeypatch.setattr(backends_row, "torchao_available", lambda: False)
    thresholds_when_timed = []

    def interleaved(fns, repeats, device):
        for name, fn in fns.items():
            if name.startswith("fcos-d2"):
                fn()  # a timed call: the model runs its eval-mode copy
        thresholds_when_timed.extend(m.inference_copy._copy.score_thresh for m in built)
        return {name: 1.0 for name in fns}

    results = backends_row.measure((64, 96), 1, interleaved, "native")
    assert len(built) == 3 and thresholds_when_timed == [0.05] * 3  # eager, "bf16", "auto"
    assert "auto:" in [r for r in results if r["contender"] == "fcos-d2 auto"][0]["auto_choice"]
    # fp32's own top detections, found at threshold 0 by the (identical) eager models
    assert all(r["found_of_top"] == "20/20" for r in results if "found_of_top" in r)
