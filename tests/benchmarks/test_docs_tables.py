"""benchmarks.tables: the docs' tables generated from hand-made records, each row traced to
its records (line numbers, commits, CPU); a missing or malformed records file stops it with
the file and the line; --check tells stale tables."""
import json

import pytest

from benchmarks import tables

CPU = {"model": "Example CPU", "flags": ["amx_bf16", "avx512_bf16"], "cores": 2}


def _record(benchmark, seed=0, overrides=(), metrics=None, times=None, run=None,
            commit="a" * 40, dirty=False):
    return {"benchmark": benchmark, "date": "2026-12-05T14:00:00+00:00", "commit": commit,
            "dirty": dirty, "cpu": CPU, "command": f"python -m benchmarks.{benchmark}",
            "seed": seed, "overrides": list(overrides), "metrics": metrics or {},
            "times": times or {}, "run": run or {}}


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _train_quality(seed, ap, contender="fcos-d2 recipe", overrides=(), **kwargs):
    return _record("train_quality", seed, overrides, {"AP": ap, "AP50": 2 * ap},
                   {"train_seconds": 100.0 + seed}, {"contender": contender}, **kwargs)


def test_training_quality_rows_are_per_contender_and_overrides_over_seeds(tmp_path):
    path = _write(tmp_path / "train_quality.jsonl", [
        _train_quality(0, 10.0), _train_quality(1, 14.0, commit="b" * 40, dirty=True),
        _train_quality(0, 5.0, overrides=["SOLVER.MAX_ITER", "20"]),
        _train_quality(2, 12.0)])
    lines = tables.generate(path).splitlines()
    assert lines[0] == (f"_Generated from {path} by python -m benchmarks.tables; do not edit._")
    assert lines[2] == "# Training quality on small data (python -m benchmarks.train_quality)"
    cpu = "Example CPU (amx_bf16, avx512_bf16)"
    # mean 12.0, sample std of (10, 14, 12) = 2.0
    assert lines[-2] == (f"| fcos-d2 recipe | shapes | none | 0, 1, 2 | 12.0 / 2.0 | 24.0 / 4.0 | "
                         f"101 | aaaaaaa, bbbbbbb+dirty | {cpu} | 1, 2, 4 |")
    assert lines[-1] == (f"| fcos-d2 recipe | shapes | SOLVER.MAX_ITER 20 | 0 | 5.0 / n/a | "
                         f"10.0 / n/a | 100 | aaaaaaa | {cpu} | 3 |")


def test_speed_rows_give_timed_results_parts_other_results_and_the_targets(tmp_path):
    rows = {"inference": [{"row": "inference", "contender": "fcos-d2 fp32", "batch": 4,
                           "seconds": 0.5}],
            "parts": [{"row": "parts", "part": "targets+losses", "fcos_d2_seconds": 0.25,
                       "torchvision_seconds": 0.5}],
            "flops": [{"row": "flops", "backbone_head_gmacs": 1.23456}]}
    record = _record("speed", metrics={"rows": rows, "targets": {"x / y (<= 1)": 0.25}},
                     run={"machine": {"device": "cpu"}, "options": {"threads": 1}})
    lines = tables.generate(_write(tmp_path / "speed.jsonl", [record])).splitlines()
    cpu = "Example CPU (amx_bf16, avx512_bf16)"
    assert f"| inference | fcos-d2 fp32 | 4 | 500.0 | 8.00 |  |  | cpu | 1 | aaaaaaa | {cpu} " \
        "| 1 |" in lines  # no floor in this result: its two cells empty
    assert f"| targets+losses | 250.0 | 500.0 | 2.00 | cpu | 1 | aaaaaaa | {cpu} | 1 |" in lines
    assert f'| flops | {{"backbone_head_gmacs": 1.235}} | cpu | 1 | aaaaaaa | {cpu} | 1 |' in lines
    assert lines[-1] == f"| x / y (<= 1) | 0.25 | aaaaaaa | {cpu} | 1 |"


def test_mask_runs_and_latency_get_their_own_tables(tmp_path):
    runs = [_record("masks", seed, metrics={"mask": {"AP": ap}, "box": {"AP": ap + 10}},
                    run={"contender": "sipmask", "iters": 600}) for seed, ap in ((0, 20), (1, 30))]
    thin = _record("masks", 0, metrics={"mask": {"AP": 5}, "box": {"AP": 15}},
                   run={"contender": "sipmask", "iters": 600, "mask_regime": "thin"})
    latency = _record("masks", metrics={"sipmask": {"ms_per_image": 42.25}},
                      run={"kind": "latency", "iters": 600, "mask_regime": "thin"})
    lines = tables.generate(_write(tmp_path / "masks.jsonl",
                                   [*runs, thin, latency])).splitlines()
    cpu = "Example CPU (amx_bf16, avx512_bf16)"
    # records without a data regime are the quickstart's; the thin one is a row of its own
    assert (f"| quickstart | sipmask | trained | none | 600 | 0, 1 | 25.0 / 7.1 | 35.0 / 7.1 | "
            f"aaaaaaa | {cpu} | 1, 2 |") in lines
    assert (f"| thin | sipmask | trained | none | 600 | 0 | 5.0 / n/a | 15.0 / n/a | "
            f"aaaaaaa | {cpu} | 3 |") in lines
    assert lines[-1] == f"| thin | sipmask | none | 600 | 42.2 | aaaaaaa | {cpu} | 4 |"


def test_cost_estimates_give_each_model_and_its_ratio_to_the_reference(tmp_path):
    record = _record("train_quality_costs",
                     metrics={"median_seconds_per_iteration": {"shapes": 0.5, "thin": 2.0}},
                     run={"kind": "regime-cost", "repeats": 10, "reference": "shapes"})
    lines = tables.generate(_write(tmp_path / "train_quality_costs.jsonl", [record]))
    cpu = "Example CPU (amx_bf16, avx512_bf16)"
    assert lines.splitlines()[-2:] == [
        f"| regime-cost | shapes | 0.500 | 1.00 | shapes | 10 | aaaaaaa | {cpu} | 1 |",
        f"| regime-cost | thin | 2.000 | 4.00 | shapes | 10 | aaaaaaa | {cpu} | 1 |"]


def test_epochs_rows_are_per_regime_overrides_and_epochs_in_ascending_epochs(tmp_path):
    def run(epochs, seed, ap, curve, seconds=100.0):
        return _record("epochs", seed, metrics={"AP": ap, "AP50": 2 * ap, "curve": curve},
                       times={"train_and_eval_seconds": seconds},
                       run={"regime": "thin", "epochs": epochs})

    records = [run(24, 0, 30.0, [[12, 20.0], [24, 30.0]], 300.0),
               run(12, 0, 10.0, [[4, 2.0], [8, 12.0], [12, 10.0]]),
               run(24, 1, 34.0, [[12, 36.0], [24, 34.0]], 340.0)]
    lines = tables.generate(_write(tmp_path / "epochs.jsonl", records)).splitlines()
    assert lines[2] == "# AP against epochs of the small-data recipe (python -m benchmarks.epochs)"
    cpu = "Example CPU (amx_bf16, avx512_bf16)"
    # E=24: mean 32.0, sample std of (30, 34) 2.8; best along the runs 30 and 36, mean 33
    assert lines[8:10] == [
        f"| thin | none | 12 | 0 | 10.0 / n/a | 10.0-10.0 | 12.0 | 100 | aaaaaaa | {cpu} | 2 |",
        f"| thin | none | 24 | 0, 1 | 32.0 / 2.8 | 30.0-34.0 | 33.0 | 320 | aaaaaaa | {cpu} | "
        "1, 3 |"]
    assert lines[10] == ""  # then the runs' curves
    # the longest schedule (24) along its runs: epoch 12 seeds 20 and 36, epoch 24 30 and 34
    assert lines[-2:] == ["| thin | none | 24 | 12 | s0 20.0, s1 36.0 | 28.0 / 11.3 |",
                          "| thin | none | 24 | 24 | s0 30.0, s1 34.0 | 32.0 / 2.8 |"]


def test_another_benchmark_gets_a_row_per_record(tmp_path):
    record = _record("other", seed=7, metrics={"x": 1}, times={"s": 2.0})
    lines = tables.generate(_write(tmp_path / "other.jsonl", [record])).splitlines()
    assert lines[2] == "# other records"
    assert lines[-1] == ('| 7 | none | {"x": 1} | {"s": 2.0} | aaaaaaa | '
                         'Example CPU (amx_bf16, avx512_bf16) | 1 |')


def test_the_command_writes_one_table_per_records_file_and_check_tells_stale_ones(tmp_path):
    _write(tmp_path / "train_quality.jsonl", [_train_quality(0, 10.0)])
    docs = tmp_path / "docs"
    argv = ["--records", str(tmp_path), "--docs", str(docs)]
    assert tables.main(argv + ["--check"]) == 1  # nothing generated yet
    assert tables.main(argv) == 0
    assert [p.name for p in docs.iterdir()] == ["train_quality.md"]
    assert (docs / "train_quality.md").read_text() == \
        tables.generate(tmp_path / "train_quality.jsonl")
    assert tables.main(argv + ["--check"]) == 0
    _write(tmp_path / "train_quality.jsonl", [_train_quality(0, 11.0)])  # a new record
    assert tables.main(argv + ["--check"]) == 1


def test_a_malformed_records_file_stops_the_command_naming_the_file_and_line(tmp_path):
    path = tmp_path / "speed.jsonl"
    path.write_text(json.dumps(_record("speed")) + "\n{broken\n")
    with pytest.raises(SystemExit, match=f"{path}, line 2: not JSON"):
        tables.main(["--records", str(tmp_path), "--docs", str(tmp_path / "docs")])
    assert not (tmp_path / "docs").exists()


def test_a_folder_without_records_files_is_an_error_naming_it(tmp_path):
    with pytest.raises(SystemExit, match=f"{tmp_path}: no records files"):
        tables.main(["--records", str(tmp_path)])


def test_the_repositorys_tables_are_those_its_records_generate(capsys):
    """After a benchmark run, `make docs-tables` (python -m benchmarks.tables) and commit
    the records with the tables."""
    assert tables.main(["--check"]) == 0, capsys.readouterr().err


def test_mask_cap_rows_are_per_record_and_settings(tmp_path):
    caps = {"official": {"< 16 px": 62.44, "16-32 px": 83.1, "32-64 px": 92.4,
                         "> 64 px": 96.5, "all": 84.9, "COCO AP": 84.55},
            "defaults": {"< 16 px": 81.0, "all": 93.5}}
    path = _write(tmp_path / "mask_cap.jsonl", [
        _record("mask_cap", metrics=caps, run={"dataset": "synthetic_masks_val"})])
    lines = tables.generate(path).splitlines()
    cpu = "Example CPU (amx_bf16, avx512_bf16)"
    assert lines[-2] == ("| synthetic_masks_val | official | 62.4 | 83.1 | 92.4 | 96.5 | 84.9 | "
                         f"84.5 | aaaaaaa | {cpu} | 1 |")
    assert lines[-1] == ("| synthetic_masks_val | defaults | 81.0 | - | - | - | 93.5 | - | "
                         f"aaaaaaa | {cpu} | 1 |")


def test_dcn_offsets_rows_are_per_record_part_and_map_largest_first(tmp_path):
    def conv(size, offset, outside, largest):
        return {"map": [size, size], "mean_abs_offset": offset, "outside": outside,
                "mask": 0.5, "max_abs_offset": largest}

    convs = {"backbone.cells.0.ops.0 @ 4x4": conv(4, 1.0, 0.5, 3.0),
             "backbone.cells.1.ops.0 @ 4x4": conv(4, 3.0, 0.7, 9.0),
             "backbone.cells.2.ops.0 @ 16x16": conv(16, 0.2, 0.1, 1.0),
             "head.cls_shared.0 @ 2x2": conv(2, 0.5, 0.9, 2.0)}
    path = _write(tmp_path / "dcn_offsets.jsonl", [
        _record("dcn_offsets", overrides=["SOLVER.DEFORM_OFFSET_LR_FACTOR", "0.1"],
                metrics={"convs": convs},
                run={"contender": "nas", "weights": "/x/runs/nas-0/model_final.pth"})])
    rows = [line for line in tables.generate(path).splitlines() if line.startswith("| nas |")]
    cells = [row.split(" | ")[1:10] for row in rows]
    trained = "SOLVER.DEFORM_OFFSET_LR_FACTOR 0.1"
    assert cells == [
        [trained, "nas-0/model_final.pth", "backbone", "16x16", "1", "0.20", "1.0", "10%", "0.50"],
        [trained, "nas-0/model_final.pth", "backbone", "4x4", "2", "2.00", "9.0", "60%", "0.50"],
        [trained, "nas-0/model_final.pth", "head", "2x2", "1", "0.50", "2.0", "90%", "0.50"]]


def test_search_proxy_rows_name_the_member_contender_reward_and_search(tmp_path):
    command = "python -m benchmarks.train_quality.search_check rewards --member"
    path = _write(tmp_path / "search_proxy.jsonl", [
        {**_record("search_proxy", metrics={"reward": -0.33172},
                   run={"contender": "nas a", "member": "nas-fcos"}),
         "command": f"{command} nas-fcos --contenders 'nas a' -- --channels 128 "
                    "--bottom-up-weights 'out/recipe 0/model_final.pth'"},
        {**_record("search_proxy", metrics={"reward": 1.13451},
                   run={"contender": "fad b", "member": "fad"}),
         "command": f"{command} fad --alphas out/search/alphas.json --contenders 'fad b'"}])
    lines = tables.generate(path).splitlines()
    cpu = "Example CPU (amx_bf16, avx512_bf16)"
    assert lines[-2] == ("| nas-fcos | nas a | -0.3317 | --channels 128 --bottom-up-weights "
                         f"out/recipe 0/model_final.pth | aaaaaaa | {cpu} | 1 |")
    assert lines[-1] == (f"| fad | fad b | 1.1345 | --alphas out/search/alphas.json | "
                         f"aaaaaaa | {cpu} | 2 |")
