"""The training-quality benchmark's run records (``OUTPUT/results.jsonl``, one per
(contender, seed)): checks that they are of one regime and one set of overrides, their
tables, and the repository record (``benchmarks.records``) each run also writes."""
import statistics
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from benchmarks import records
from benchmarks.runner import load_results

BENCHMARK = "train_quality"  # benchmarks/results/train_quality.jsonl
METRICS = ("AP", "AP50", "APs", "step1_AP", "step1_lef_AP")
TIMES = ("train_seconds", "train_seconds_step1", "train_seconds_step2")


def checked_results(path: Path, regime: str) -> List[dict]:
    """The records of `path`, which must all be of `regime` (a record without "regime" is
    of "shapes"): results of two regimes never mix in one table."""
    results = load_results(path)
    others = sorted({r.get("regime", "shapes") for r in results} - {regime})
    if others:
        raise SystemExit(f"{path} holds results of regime {others}, not of '{regime}': use "
                         f"another --output for --regime {regime}")
    return results


def model_overrides(opts: Sequence) -> List[str]:
    """`opts` (KEY VALUE ...) as strings, without MODEL.DEVICE: the overrides that change
    what a run trains (the device changes only where it trains)."""
    opts = [str(o) for o in opts]
    pairs = [opts[i:i + 2] for i in range(0, len(opts), 2)]
    return [item for pair in pairs if pair[0] != "MODEL.DEVICE" for item in pair]


def other_overrides(results: List[dict], opts: Sequence) -> Optional[str]:
    """The first of `results` trained with other overrides than `opts` (MODEL.DEVICE aside),
    described; None if none. A record without "opts" (written before records kept them)
    cannot be checked and passes."""
    wanted = model_overrides(opts)
    for result in results:
        if "opts" in result and model_overrides(result["opts"]) != wanted:
            return (f"'{result['contender']}' seed {result['seed']} ran with the overrides "
                    f"{result['opts'] or 'none'}, not {list(opts) or 'none'}")
    return None


def repository_record(result: dict, command: str) -> dict:
    """The ``benchmarks.records`` record of one run's `result` (a results.jsonl line):
    its seed, metrics and times (with the seconds per iteration) apart, the rest
    (diagnostics aside, the iterations done included) under "run"."""
    kept = {k: v for k, v in result.items()
            if k not in (*METRICS, *TIMES, "diagnostics", "seed")}
    return records.make_record(
        BENCHMARK, command=command, seed=result["seed"], overrides=result.get("opts", []),
        metrics={k: result[k] for k in METRICS if k in result},
        times={**{k: result[k] for k in TIMES if k in result},
               **seconds_per_iteration(result)}, run=kept)


def seconds_per_iteration(result: dict) -> Dict[str, float]:
    """{"seconds_per_iteration": training seconds / iterations done} of a run's `result`;
    {} where it keeps no count of iterations (records written before 2026-12-05) or did
    none."""
    if not result.get("iterations") or "train_seconds" not in result:
        return {}
    return {"seconds_per_iteration": round(result["train_seconds"] / result["iterations"], 4)}


def summarise(results: List[dict], names: List[str]) -> str:
    """A markdown table: per contender, mean / sample std / range of AP and AP50."""
    rows = ["| contender | seeds | AP mean | AP std | AP min-max | AP50 mean | AP50 std |",
            "|---|---|---|---|---|---|---|"]
    for name in names:
        runs = sorted((r for r in results if r["contender"] == name), key=lambda r: r["seed"])
        if not runs:
            continue
        ap, ap50 = [r["AP"] for r in runs], [r["AP50"] for r in runs]
        std = lambda v: statistics.stdev(v) if len(v) > 1 else float("nan")  # noqa: E731
        notes = "; ".join(f"seed {r['seed']} {r['status']}" for r in runs if r["status"] != "ok")
        rows.append(f"| {name}{' (' + notes + ')' if notes else ''} | "
                    f"{','.join(str(r['seed']) for r in runs)} | {statistics.mean(ap):.1f} | "
                    f"{std(ap):.1f} | {min(ap):.1f}-{max(ap):.1f} | {statistics.mean(ap50):.1f} | "
                    f"{std(ap50):.1f} |")
    return "\n".join(rows)


def summarise_times(results: List[dict], names: List[str]) -> str:
    """A markdown table: per contender, the mean training seconds of a run (LabelEnc: of
    each step too), and for LabelEnc the mean AP of step 1's detector and of its LEF (over
    the runs that recorded them)."""
    rows = ["| contender | training s (mean) | per step | step-1 detector AP | step-1 LEF AP |",
            "|---|---|---|---|---|"]
    for name in names:
        runs = [r for r in results if r["contender"] == name and r["status"] == "ok"]
        if not runs:
            continue
        mean = lambda key: statistics.mean(r[key] for r in runs)  # noqa: E731
        steps = (f"{mean('train_seconds_step1'):.0f} + {mean('train_seconds_step2'):.0f}"
                 if "train_seconds_step2" in runs[0] else "")
        rows.append(f"| {name} | {mean('train_seconds'):.0f} | {steps} | "
                    f"{mean_of_recorded(runs, 'step1_AP')} | "
                    f"{mean_of_recorded(runs, 'step1_lef_AP')} |")
    return "\n".join(rows)


def mean_of_recorded(runs: List[Dict], key: str) -> str:
    """The mean of `key` over the `runs` that hold a value for it, with their count if not
    all do; blank if none does."""
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return ""
    count = "" if len(values) == len(runs) else f" ({len(values)} of {len(runs)} runs)"
    return f"{statistics.mean(values):.1f}{count}"
