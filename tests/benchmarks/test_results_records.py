"""benchmarks.records: a run's record (commit, CPU kind, seed, overrides, metrics, times,
command) appended to its benchmark's records file and read back; a missing or malformed
file is an error naming the file and the line; and the benchmarks write such records."""
import json
import subprocess

import pytest

from benchmarks import records
from benchmarks.train_quality import catalog, cli, contenders, protocol

CPUINFO = """processor\t: 0
model name\t: Example CPU 9000
flags\t\t: fpu sse2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8
processor\t: 1
model name\t: Example CPU 9000
flags\t\t: fpu sse2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8
"""


def test_the_cpu_kind_is_the_model_name_and_its_bf16_and_amx_flags(tmp_path):
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    kind = records.cpu_kind(str(tmp_path / "cpuinfo"))
    assert kind["model"] == "Example CPU 9000"
    assert kind["flags"] == ["amx_bf16", "amx_int8", "amx_tile", "avx512_bf16"]
    assert records.cpu_kind(str(tmp_path / "none"))["model"] == "unknown"


def test_a_record_is_appended_to_its_benchmarks_file_and_read_back(records_dir):
    record = records.make_record("toy", command="python -m benchmarks.toy --x 1", seed=3,
                                 overrides=["SOLVER.MAX_ITER", 20], metrics={"AP": 41.5},
                                 times={"train_seconds": 12.0}, run={"contender": "a"})
    assert records.append_record(record) == records_dir / "toy.jsonl"
    records.append_record({**record, "seed": 4})
    first, second = records.read_records(records_dir / "toy.jsonl")
    assert first == record and second["seed"] == 4
    assert record["overrides"] == ["SOLVER.MAX_ITER", "20"]  # strings, as on a command line
    assert len(record["commit"]) == 40 and isinstance(record["dirty"], bool)
    assert record["cpu"] == records.cpu_kind() and record["date"].endswith("+00:00")
    assert set(records.REQUIRED_KEYS) <= set(record)


def test_line_numbers_count_blank_lines(tmp_path):
    record = {key: 0 for key in records.REQUIRED_KEYS}
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(record) + "\n\n" + json.dumps({**record, "seed": 1}) + "\n")
    assert [(n, r["seed"]) for n, r in records.read_numbered_records(path)] == [(1, 0), (3, 1)]


def test_a_missing_records_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(records.RecordsError, match=f"{tmp_path / 'no.jsonl'}: no such records"):
        records.read_records(tmp_path / "no.jsonl")


@pytest.mark.parametrize("line, problem", [
    ("{not json", "line 2: not JSON"),
    ("[1, 2]", "line 2: a list, not a record"),
    ('{"benchmark": "x"}', "line 2: the record lacks \\['date', 'commit'"),
])
def test_a_malformed_line_is_an_error_naming_the_file_and_the_line(tmp_path, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({key: 0 for key in records.REQUIRED_KEYS}) + "\n" + line + "\n")
    with pytest.raises(records.RecordsError, match=f"{path}, {problem}"):
        records.read_records(path)


def test_a_checkout_is_dirty_for_changed_tracked_files_but_not_for_its_records(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c",
                        "user.email=t@t", *args], check=True, capture_output=True)

    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "code.py").write_text("a = 1\n")
    (tmp_path / "benchmarks" / "results" / "x.jsonl").write_text("")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    (tmp_path / "benchmarks" / "results" / "x.jsonl").write_text("{}\n")
    (tmp_path / "untracked.txt").write_text("")
    assert records.git_state(tmp_path) == (head, False)
    (tmp_path / "code.py").write_text("a = 2\n")
    assert records.git_state(tmp_path) == (head, True)
    assert records.git_state(tmp_path / "benchmarks" / "results" / "none") == ("unknown", False)


def test_a_training_quality_run_appends_its_result_and_a_record(tmp_path, monkeypatch,
                                                                records_dir):
    class Trained(contenders.Contender):
        def run(self, seed, output_dir, opts, regime="shapes", **kwargs):
            return [{"contender": self.name, "AP": 30.0, "AP50": 50.0, "APs": None,
                     "seed": seed, "status": "ok", "final_losses": {"loss": 0.5},
                     "train_seconds": 99.0, "diagnostics": {"big": [1] * 10}}]

    monkeypatch.setattr(protocol, "register_datasets", lambda regime: None)
    monkeypatch.setattr(catalog, "contender", Trained)
    argv = ["--run", "toy", "--seed", "2", "--output", str(tmp_path), "--regime", "thin",
            "SOLVER.MAX_ITER", "20"]
    cli.main(argv)
    (result,) = [json.loads(line) for line in open(tmp_path / "results.jsonl")]
    assert result["opts"] == ["SOLVER.MAX_ITER", "20"] and result["regime"] == "thin"
    (record,) = records.read_records(records_dir / "train_quality.jsonl")
    assert record["command"] == ("python -m benchmarks.train_quality --run toy --seed 2 "
                                 f"--output {tmp_path} --regime thin SOLVER.MAX_ITER 20")
    assert (record["seed"], record["overrides"]) == (2, ["SOLVER.MAX_ITER", "20"])
    assert record["metrics"] == {"AP": 30.0, "AP50": 50.0, "APs": None}
    assert record["times"] == {"train_seconds": 99.0}
    assert record["run"] == {"contender": "toy", "status": "ok", "final_losses": {"loss": 0.5},
                             "opts": ["SOLVER.MAX_ITER", "20"], "regime": "thin"}


def test_a_record_names_the_recipe_and_tables_never_pool_two_recipes(tmp_path):
    from benchmarks.tables import train_quality_table

    (tmp_path / "configs").mkdir()
    recipe = tmp_path / "configs" / "FCOS-R18-small-data.yaml"
    recipe.write_text("a: 1\n")
    before = records.recipe_digest(tmp_path)
    recipe.write_text("a: 2\n")
    assert len(before) == 8 and records.recipe_digest(tmp_path) != before
    assert len(records.make_record("x", command="c", seed=0, overrides=[], metrics={},
                                   times={})["recipe"]) == 8

    def run(seed, ap, digest=None):
        record = {"seed": seed, "overrides": ["K", "V"], "metrics": {"AP": ap, "AP50": ap},
                  "times": {}, "run": {"contender": "fcos-d2 recipe"}, "commit": "abc",
                  "dirty": False, "cpu": {"model": "cpu", "flags": []}}
        return record if digest is None else {**record, "recipe": digest}

    assert records.overrides_key(run(0, 1.0)) == ("K", "V")
    assert records.overrides_key(run(0, 1.0, "d1")) == ("K", "V", "[recipe d1]")
    rows = [line for line in train_quality_table(
        [(1, run(0, 10.0)), (2, run(1, 20.0)), (3, run(0, 60.0, "d1"))]) if "| fcos-d2" in line]
    # the two records without a digest in one row, the new recipe's in its own
    assert len(rows) == 2 and "| K V | 0, 1 | 15.0" in rows[0]
    assert "| K V [recipe d1] | 0 | 60.0" in rows[1]
