"""The benchmarks as commands, ``python -m benchmarks.<name>`` from the repository's root
(through the ``scripts`` fixture's ``run_module``): the tables command end to end, and the
cheap modes of the others."""
import json

import pytest
import torch

from benchmarks.records import RECORDS_DIR_ENV, REQUIRED_KEYS
from benchmarks.train_quality import catalog


def _speed_record(seconds: float) -> dict:
    record = {key: None for key in REQUIRED_KEYS}
    rows = {"inference": [{"row": "inference", "contender": "fcos-d2 fp32", "batch": 1,
                           "seconds": seconds}]}
    return {**record, "benchmark": "speed", "commit": "c" * 40, "overrides": [],
            "cpu": {"model": "Example CPU", "flags": []}, "metrics": {"rows": rows},
            "times": {}, "run": {}}


def test_the_tables_command_writes_checks_and_names_a_malformed_line(scripts, tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    (records / "speed.jsonl").write_text(json.dumps(_speed_record(0.25)) + "\n")
    argv = ["--records", str(records), "--docs", str(tmp_path / "docs")]
    result = scripts.run_module("benchmarks.tables", *argv)
    assert result.returncode == 0, result.stderr
    table = (tmp_path / "docs" / "speed.md").read_text()
    assert table.startswith(f"_Generated from {records / 'speed.jsonl'} by python -m "
                            "benchmarks.tables; do not edit._\n")
    assert "| inference | fcos-d2 fp32 | 1 | 250.0 | 4.00 |" in table
    assert scripts.run_module("benchmarks.tables", *argv, "--check").returncode == 0
    with open(records / "speed.jsonl", "a") as f:
        f.write('{"benchmark": "speed"}\n')
    result = scripts.run_module("benchmarks.tables", *argv)
    assert result.returncode == 1
    assert f"{records / 'speed.jsonl'}, line 2: the record lacks" in result.stderr


def test_the_training_quality_command_lists_its_contenders(scripts):
    result = scripts.run_module("benchmarks.train_quality", "--list")
    assert result.returncode == 0, result.stderr
    names = catalog.contender_names()
    if not catalog.has_detectron2_fcos():  # the command says so and leaves them out
        names = [n for n in names if n.split("+")[0] != catalog.DETECTRON2]
    assert result.stdout.strip().splitlines()[-len(names):] == names


def test_the_speed_command_without_a_gpu_skips_cuda_and_records_nothing(scripts, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: --device cuda would run the whole benchmark")
    result = scripts.run_module("benchmarks.speed", "--device", "cuda", "--json",
                                str(tmp_path / "b.json"), env={RECORDS_DIR_ENV: str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "skipped: --device cuda: CUDA is not available" in result.stdout
    assert json.loads((tmp_path / "b.json").read_text())["rows"] == {}
    assert not (tmp_path / "speed.jsonl").exists()
