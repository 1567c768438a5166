"""The cells the generated tables share (``benchmarks.tables``, ``benchmarks.family_tables``):
a record's CPU and commit, distinct values joined, mean / std, markdown rows and tables."""
import statistics
from collections import OrderedDict
from typing import List, Sequence


def cpu(record: dict) -> str:
    """The record's CPU model with its bf16/AMX flags."""
    kind = record["cpu"]
    flags = f" ({', '.join(kind['flags'])})" if kind.get("flags") else ""
    return f"{kind['model']}{flags}"


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
