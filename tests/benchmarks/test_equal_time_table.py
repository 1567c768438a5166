"""The training-quality table at equal iterations and at equal training time
(``benchmarks.train_quality.equal_time`` through ``benchmarks.tables``), from hand-made
records: the reference schedule, the budget of the fastest contender, each contender's
iterations in it and the measured run that fits."""
import json

from benchmarks import tables
from benchmarks.train_quality import equal_time

CPU = {"model": "Example CPU", "flags": ["avx512_bf16"], "cores": 2}


def _run(contender, seed, ap, iterations, seconds, overrides=(), status="ok"):
    run = {"contender": contender, "status": status}
    if iterations is not None:
        run["iterations"] = iterations
    return {"benchmark": "train_quality", "date": "2026-12-05T15:00:00+00:00",
            "commit": "a" * 40, "dirty": False, "cpu": CPU, "command": "python -m x",
            "seed": seed, "overrides": list(overrides), "metrics": {"AP": ap, "AP50": 2 * ap},
            "times": {"train_seconds": seconds}, "run": run}


SHORT = ["SOLVER.MAX_ITER", "200", "SOLVER.STEPS", "(167,)"]
RECORDS = [
    _run("fcos-d2 recipe", 0, 10.0, 600, 300.0),  # line 1
    _run("fcos-d2 recipe", 1, 12.0, 600, 330.0),  # 2: mean 11.0 AP, 315 s, 0.525 s / it.
    _run("detectron2 faster-rcnn", 0, 8.0, 600, 900.0),  # 3: 1.5 s / it.
    _run("detectron2 faster-rcnn", 0, 5.0, 200, 310.0, SHORT),  # 4: fits 315 s
    _run("fcos-d2 recipe", 0, 30.0, 1200, 640.0, ["SOLVER.MAX_ITER", "1200"]),  # 5: longer
    _run("torchvision", 0, 6.0, 600, 420.0),  # 6: 0.7 s / it.
    _run("fcos-d2 recipe", 2, 0.0, 100, 50.0, status="diverged: loss nan"),  # 7: left out
    _run("fcos-d2 recipe", 0, 11.0, 600, 60.0, ["MODEL.DEVICE", "cuda"]),  # 8: its own
    _run("torchvision", 3, 4.0, None, 999.0),  # 9: no count of iterations: left out
    {**_run("fcos-d2 recipe", 4, 9.0, 600, 500.0),
     "cpu": {**CPU, "flags": []}},  # 10: the same model without bf16: its own comparison
]


def test_the_table_gives_each_contender_at_equal_iterations_and_at_equal_time(tmp_path):
    path = tmp_path / "train_quality.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    lines = tables.generate(path).splitlines()
    start = lines.index("## At equal iterations and at equal training time")
    assert lines[start + 2] == tables.EQUAL_TIME_DEFINITION
    assert lines[start + 4] == (
        "Regime shapes, Example CPU (avx512_bf16), overrides besides the schedule's: none; "
        "reference 600 iterations; budget 315 s, the training time of the fastest contender "
        "there (fcos-d2 recipe):")
    # budget 315 s: the recipe 315 / 0.525 = 600 iterations, Faster R-CNN 315 / 1.5 = 210
    # (its 200-iteration run fits), torchvision 315 / 0.7 = 450 (no run fits)
    assert lines[start + 8:start + 11] == [
        "| fcos-d2 recipe | 0, 1 | 11.0 | 0.525 | 315 | 600 | 11.0 | 600 it., 315 s | 1, 2 |",
        "| detectron2 faster-rcnn | 0 / 0 | 8.0 | 1.500 | 900 | 210 | 5.0 | 200 it., 310 s "
        "| 3, 4 |",
        "| torchvision | 0 | 6.0 | 0.700 | 420 | 450 |  | none: needs a run of at most 450 "
        "iterations | 6 |"]
    # the recipe's 1200-iteration run (line 5) gets a table of its own, budget 640 s: Faster
    # R-CNN 640 / mean(1.5, 1.55) = 419 iterations, where its 200-iteration run is under
    # half and does not count; torchvision 640 / 0.7 = 914, its 600-iteration run counts;
    # neither ran 1200
    assert lines[start + 12] == (
        "Regime shapes, Example CPU (avx512_bf16), overrides besides the schedule's: none; "
        "reference 1200 iterations, another schedule of fcos-d2 recipe; budget 640 s, its "
        "training time there:")
    assert lines[start + 16:start + 19] == [
        "| fcos-d2 recipe | 0 | 30.0 | 0.533 | 640 | 1200 | 30.0 | 1200 it., 640 s | 5 |",
        "| detectron2 faster-rcnn |  |  | 1.525 |  | 419 |  | none: its run of 200 it. is "
        "under half of them; needs one of 210-419 iterations | 3, 4 |",
        "| torchvision | 0 |  | 0.700 |  | 914 | 6.0 | 600 it., 420 s | 6 |"]
    assert lines[start + 20] == (
        "Regime shapes, Example CPU (avx512_bf16), overrides besides the schedule's: "
        "MODEL.DEVICE cuda; reference 600 iterations; budget 60 s, the training time of the "
        "fastest contender there (fcos-d2 recipe):")
    assert lines[start + 24] == \
        "| fcos-d2 recipe | 0 | 11.0 | 0.100 | 60 | 600 | 11.0 | 600 it., 60 s | 8 |"
    assert lines[start + 26].startswith("Regime shapes, Example CPU, overrides besides the "
                                        "schedule's: none; reference 600 iterations; budget "
                                        "500 s")
    assert lines[-1] == \
        "| fcos-d2 recipe | 4 | 9.0 | 0.833 | 500 | 600 | 9.0 | 600 it., 500 s | 10 |"


def test_records_without_a_count_of_iterations_give_no_equal_time_table(tmp_path):
    path = tmp_path / "train_quality.jsonl"
    path.write_text(json.dumps(_run("torchvision", 0, 4.0, None, 99.0)) + "\n")
    assert "## At equal iterations" not in tables.generate(path)


def test_the_reference_is_the_count_most_contenders_ran_and_the_fewest_on_a_tie():
    def curve(*counts):
        return {c: None for c in counts}

    assert equal_time.reference_iterations({"a": curve(100, 600), "b": curve(600),
                                            "c": curve(100, 600)}) == 600
    assert equal_time.reference_iterations({"a": curve(200, 100), "b": curve(100, 200)}) == 100


def test_the_schedule_keys_are_not_part_of_a_comparisons_overrides():
    assert equal_time.other_than_schedule(
        ["SOLVER.MAX_ITER", "1200", "MODEL.DEVICE", "cuda", "SOLVER.STEPS", "(1000,)",
         "SOLVER.WARMUP_ITERS", "100", "SOLVER.BASE_LR", "0.02"]) == \
        ("MODEL.DEVICE", "cuda", "SOLVER.BASE_LR", "0.02")
