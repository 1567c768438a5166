"""The cells the generated tables share (``benchmarks.tables``, ``benchmarks.family_tables``):
a record's CPU and commit, distinct values joined, mean / std, markdown rows and tables,
and the seeds of runs from CPUs of both kinds (native bf16 or not) told apart."""
import statistics
from collections import OrderedDict
from typing import Iterable, List, Optional, Sequence, Tuple

# /proc/cpuinfo flags of a CPU that computes bf16 natively: the policy's own list
from fcos_d2.precision import NATIVE_BF16_FLAGS

# The mark of a seed trained on a CPU without native bf16 beside seeds trained on one, and
# what it means: the recipe's bf16 autocast (SOLVER.AMP.ENABLED) runs in float32 there
NO_BF16_MARK = "*"
NO_BF16_NOTE = ("* trained on a CPU without native bf16 (AVX2 only), in float32 where the "
                "row's config asks for bf16 autocast; the unmarked seeds ran on a CPU with "
                "native bf16")


def cpu(record: dict) -> str:
    """The record's CPU model with its bf16/AMX flags."""
    kind = record["cpu"]
    flags = f" ({', '.join(kind['flags'])})" if kind.get("flags") else ""
    return f"{kind['model']}{flags}"


def native_bf16(record: dict) -> Optional[bool]:
    """Whether the record's CPU computes bf16 natively; None for a record without a CPU."""
    if "cpu" not in record:
        return None
    return any(flag in NATIVE_BF16_FLAGS for flag in record["cpu"].get("flags", ()))


def mixes_cpu_kinds(records: Iterable[dict]) -> bool:
    """Whether `records` hold runs from CPUs with and from CPUs without native bf16."""
    return {True, False} <= {native_bf16(r) for r in records}


def seeds_cell(runs: Sequence[Tuple[int, dict]], mark: bool) -> str:
    """The seeds of (seed, record) pairs, sorted, each from a CPU without native bf16
    followed by ``NO_BF16_MARK`` when `mark` (a table that mixes CPU kinds)."""
    return ", ".join(f"{seed}{NO_BF16_MARK if mark and native_bf16(r) is False else ''}"
                     for seed, r in sorted(runs, key=lambda pair: pair[0]))


def commit(record: dict) -> str:
    """The record's short commit, "+dirty" with uncommitted changes."""
    return record["commit"][:7] + ("+dirty" if record.get("dirty") else "")


def joined(values) -> str:
    """The distinct values, in order, joined by commas."""
    return ", ".join(OrderedDict.fromkeys(str(v) for v in values))


def mean_std(values: List[float]) -> str:
    """"mean / sample std" with one decimal ("mean / n/a" for one value)."""
    std = f"{statistics.stdev(values):.1f}" if len(values) > 1 else "n/a"
    return f"{statistics.mean(values):.1f} / {std}"


def row(cells: Sequence) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(header: Sequence[str], rows: List[Sequence]) -> List[str]:
    return [row(header), row(["---"] * len(header)), *(row(r) for r in rows)]
