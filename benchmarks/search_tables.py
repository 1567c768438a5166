"""Whether the family's searches earn their cost (issue 62), generated from the records:
``search_check compare`` of every searched row against its random rows and ``search_check
tau`` of each member, at the longest schedule the family rows ran (the recipe's), on all
CPUs and on those with native bf16 alone. ``python -m benchmarks.tables`` writes it to
docs/results/searches.md; ``--check`` fails when it is stale."""
from pathlib import Path
from typing import Dict, List, Optional

from benchmarks.family_tables import longer_schedules
from benchmarks.records import read_numbered_records
from benchmarks.train_quality.family_designed import SEARCH_COMPARISONS
from benchmarks.train_quality.search_check import (PROXY_BENCHMARK, TAU_TARGET, compare,
                                                   tau_lines)

DOC_NAME = "searches"  # docs/results/searches.md
MEMBERS = ("nas-fcos", "fad")
# which runs each reading counts (search_check's --cpu): all, then issue 62's own kind
READINGS = (("all", "all CPUs"), ("native-bf16", "CPUs with native bf16 only"))
COMPARE_HEADER = ["| row | seeds | AP (mean / std) |", "| --- | --- | --- |"]
TAU_HEADER = ["| contender | reward | AP (mean) | seeds | GFLOPs |",
              "| --- | --- | --- | --- | --- |"]


def latest_gflops(costs: List[dict]) -> Dict[str, float]:
    """{contender: GFLOPs} of its latest family_costs record (fvcore's count, which no load
    on the machine changes)."""
    return {r["run"]["contender"]: r["metrics"]["gflops"] for r in costs
            if "gflops" in r["metrics"]}


def _table_then_prose(lines: List[str], header: List[str]) -> List[str]:
    """`lines` (search_check's: rows, then a note or verdict lines) under `header`, each
    line that is not a row a paragraph of its own."""
    rows = [line for line in lines if line.startswith("|")]
    rest = [line for line in lines if not line.startswith("|")]
    return [*header, *rows, *(part for line in rest for part in ("", line)), ""]


def _readings(title: str, read, header: List[str]) -> List[str]:
    """`title`'s reading on all CPUs (``read("all")``: search_check's lines), then on those
    with native bf16 alone where it differs (where it does not, the title says why: every
    run had native bf16, or there is none)."""
    everything, native = read("all"), read("native-bf16")
    if native == everything:
        ran = any(line.startswith("|") and "no runs at" not in line for line in everything)
        kind = "every run on a CPU with native bf16" if ran else "no runs yet"
        return [f"### {title} ({kind})", "", *_table_then_prose(everything, header)]
    return [f"### {title}, {READINGS[0][1]}", "", *_table_then_prose(everything, header),
            f"### {title}, {READINGS[1][1]}", "", *_table_then_prose(native, header)]


def comparison_section(quality: List[dict], iterations: int) -> List[str]:
    """Each searched row against its random rows, read on each kind of CPU."""
    lines = ["## Do the searches beat random genotypes? (search_check compare)", "",
             f"Target: the searched row's mean AP over seeds beats the mean of its random "
             f"rows (benchmarks/train_quality/family_designed.py's SEARCH_COMPARISONS) by more "
             f"than its seeds' std; {iterations} iterations.", ""]
    for searched, randoms in SEARCH_COMPARISONS.items():
        lines += _readings(searched, lambda cpu: compare(quality, searched, randoms,
                                                         iterations, cpu), COMPARE_HEADER)
    return lines


def tau_section(quality: List[dict], rewards: List[dict], gflops: Dict[str, float],
                iterations: int) -> List[str]:
    """Each member's proxy rewards against trained AP, read on each kind of CPU; the
    GFLOPs' tau beside the proxy's (a ranking that needs no search)."""
    lines = ["## Does the search's proxy rank trained AP? (search_check tau)", "",
             f"Target: Kendall's tau (tau-b) between the search's reward and the mean trained "
             f"AP at least {TAU_TARGET}; {iterations} iterations; rewards from "
             f"benchmarks/results/{PROXY_BENCHMARK}.jsonl, GFLOPs from the latest "
             f"family_costs record of each contender.", ""]
    with_costs = lambda name: gflops.get(name, float("nan"))  # noqa: E731
    for member in MEMBERS:
        lines += _readings(member, lambda cpu: tau_lines(
            quality, rewards, member, iterations, flops=with_costs, cpu=cpu), TAU_HEADER)
    return lines


def searches_doc(records_dir: Path) -> Optional[str]:
    """docs/results/searches.md's text, or None while a records file it reads is missing
    or no family row ran at a longer schedule than the protocol's."""
    paths = {name: records_dir / f"{name}.jsonl"
             for name in ("train_quality", PROXY_BENCHMARK, "family_costs")}
    if not all(p.is_file() for p in paths.values()):
        return None
    read = {name: [r for _, r in read_numbered_records(p)] for name, p in paths.items()}
    schedules = longer_schedules(list(enumerate(read["train_quality"], 1)))
    if not schedules:
        return None
    iterations = schedules[-1]
    return "\n".join([
        "_Generated from benchmarks/results/train_quality.jsonl, search_proxy.jsonl and "
        "family_costs.jsonl by python -m benchmarks.tables; do not edit._", "",
        "# Do the family's searches earn their cost? (issue 62)", "",
        "The readings of python -m benchmarks.train_quality.search_check compare and tau "
        f"(--iterations {iterations}; --cpu all, then --cpu native-bf16). The rows' costs "
        "and every run: [family.md](family.md).", "",
        *comparison_section(read["train_quality"], iterations),
        *tau_section(read["train_quality"], read[PROXY_BENCHMARK],
                     latest_gflops(read["family_costs"]), iterations)]).rstrip("\n") + "\n"


def derived_outputs(records_dir: Path, docs_dir: Path) -> Dict[Path, str]:
    """{docs_dir/searches.md: its text}; {} while ``searches_doc`` has none."""
    doc = searches_doc(records_dir)
    return {} if doc is None else {docs_dir / f"{DOC_NAME}.md": doc}
