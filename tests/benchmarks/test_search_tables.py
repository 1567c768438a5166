"""docs/results/searches.md: search_check's comparisons and taus at the family's longest
schedule, generated from the records by python -m benchmarks.tables."""
import json

from benchmarks import search_tables, tables
from benchmarks.train_quality.family_designed import (FAD_RANDOM_TWO, FAD_SEARCHED_TWO,
                                                      SEARCH_COMPARISONS)

NATIVE, AVX2 = ["avx512_bf16"], ["avx2"]


def _record(benchmark, seed, metrics, run, flags=NATIVE, overrides=()):
    return {"benchmark": benchmark, "date": "d", "commit": "b" * 40, "dirty": False,
            "cpu": {"model": "CPU", "flags": flags}, "command": "c", "seed": seed,
            "overrides": list(overrides), "metrics": metrics, "times": {}, "run": run}


def _run(name, seed, ap, flags=NATIVE, iterations=4200):
    return _record("train_quality", seed, {"AP": ap, "AP50": ap},
                   {"contender": name, "iterations": iterations}, flags,
                   ["SOLVER.MAX_ITER", str(iterations)])


def _write(folder, quality, rewards, gflops):
    files = {"train_quality": quality,
             "search_proxy": [_record("search_proxy", 0, {"reward": r},
                                      {"contender": n, "member": "fad"})
                              for n, r in rewards.items()],
             "family_costs": [_record("family_costs", None, {"params_M": 1.0, "gflops": g,
                                                             "latency_ms": 5.0},
                                      {"contender": n}) for n, g in gflops.items()]}
    for name, lines in files.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def _section(doc, heading):
    """The lines of `doc` under the ### `heading` up to the next heading."""
    lines = doc.splitlines()
    start = lines.index(f"### {heading}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    return lines[start:end]


def test_the_doc_gives_each_comparison_and_tau_on_all_cpus_then_native_bf16_alone(tmp_path):
    randoms = SEARCH_COMPARISONS[FAD_SEARCHED_TWO]
    quality = [_run(FAD_SEARCHED_TWO, 0, 14.0), _run(FAD_SEARCHED_TWO, 1, 12.0, AVX2),
               _run(FAD_SEARCHED_TWO, 2, 13.0, AVX2)]
    quality += [_run(name, s, 9.0 + i) for i, name in enumerate(randoms) for s in range(3)]
    quality.append(_run(randoms[0], 0, 99.0, iterations=600))  # the protocol's: not read
    rewards = {FAD_SEARCHED_TWO: 1.2, **{n: 1.0 + i / 100 for i, n in enumerate(randoms)}}
    _write(tmp_path, quality, rewards, {FAD_SEARCHED_TWO: 3.0, randoms[0]: 2.0})
    doc = search_tables.searches_doc(tmp_path)
    everything = _section(doc, f"{FAD_SEARCHED_TWO}, all CPUs")
    assert f"| {FAD_SEARCHED_TWO} | 0, 1*, 2* | 13.0 / 1.0 |" in everything
    assert any(line.startswith(f"{FAD_SEARCHED_TWO} beats the mean of 4 random genotypes "
                               "(10.5 AP)") for line in everything)
    native = _section(doc, f"{FAD_SEARCHED_TWO}, CPUs with native bf16 only")
    assert f"| {FAD_SEARCHED_TWO} | 0 | 14.0 / - |" in native
    assert any(line.startswith(f"not decided: {FAD_SEARCHED_TWO} has one seed") for line in native)
    # a comparison whose runs are all of one kind is read once, and one without runs says so
    other = next(s for s in SEARCH_COMPARISONS if s.startswith("fad") and s != FAD_SEARCHED_TWO)
    nas = next(s for s in SEARCH_COMPARISONS if s.startswith("nas-fcos"))
    assert f"### {other} (every run on a CPU with native bf16)" in doc.splitlines()
    assert f"### {nas} (no runs yet)" in doc.splitlines()
    tau = _section(doc, "fad, all CPUs")
    assert f"| {FAD_SEARCHED_TWO} | 1.2000 | 13.0 | 0, 1*, 2* | 3.000 |" in tau  # its costs
    assert f"| {randoms[1]} | 1.0100 | 10.0 | 0, 1, 2 | nan |" in tau  # no cost record
    assert "Kendall tau over 5 architectures: 1.00 (target 0.4: not decided: 5 of the 8 " \
           "architectures needed)" in tau


def test_the_doc_waits_for_its_records_and_a_longer_schedule(tmp_path):
    _write(tmp_path, [_run(FAD_SEARCHED_TWO, 0, 14.0)], {}, {})
    assert search_tables.searches_doc(tmp_path) is not None
    _write(tmp_path, [_record("train_quality", 0, {"AP": 1.0, "AP50": 1.0},
                              {"contender": FAD_SEARCHED_TWO})], {}, {})
    assert search_tables.searches_doc(tmp_path) is None  # the protocol's schedule only
    (tmp_path / "search_proxy.jsonl").unlink()
    assert search_tables.searches_doc(tmp_path) is None


def test_benchmarks_tables_writes_the_doc_and_check_finds_it_stale(tmp_path):
    _write(tmp_path, [_run(FAD_SEARCHED_TWO, 0, 14.0), _run(list(FAD_RANDOM_TWO)[0], 0, 9.0)],
           {}, {})
    argv = ["--records", str(tmp_path), "--docs", str(tmp_path / "docs")]
    assert tables.main(argv) == 0
    doc = tmp_path / "docs" / "searches.md"
    assert doc.read_text() == search_tables.searches_doc(tmp_path)
    assert tables.main(argv + ["--check"]) == 0
    doc.write_text("edited")
    assert tables.main(argv + ["--check"]) == 1
