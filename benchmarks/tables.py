"""The docs' tables from the records: ``python -m benchmarks.tables`` (``make docs-tables``).

Reads every records file ``benchmarks/results/<benchmark>.jsonl`` (``benchmarks.records``)
and writes ``docs/results/<benchmark>.md``, headed with the file it was generated from, then
the docs read from several records files (``family_tables``: family.md and the members'
README blocks; ``search_tables``: searches.md). Each row names the records it summarises
(their line numbers in the records file), their commits and the CPU, so that a figure in the
docs can be traced to its runs. ``--check`` writes
nothing and fails if a generated file is missing or differs (the docs are stale).
"""
import argparse
import json
import shlex
import statistics
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from benchmarks import family_tables, search_tables
from benchmarks.records import (REPO, RESULTS_DIR, RecordsError, overrides_key,
                                read_numbered_records, score)
from benchmarks.table_cells import commit as _commit, cpu as _cpu, joined as _joined
from benchmarks.table_cells import mean_std as _mean_std, row as _row, table as _table
from benchmarks.train_quality import equal_time

DOCS_DIR = REPO / "docs" / "results"
Numbered = List[Tuple[int, dict]]  # (line in the records file, record)
EQUAL_TIME_DEFINITION = (
    "Per regime, CPU kind and overrides other than the schedule's, over the runs that "
    "ended ok and counted their iterations (means over seeds). The reference is the "
    "iteration count most contenders ran; the budget is the fastest contender's training "
    "time there. Equal training time: a contender's iterations in the budget are the budget "
    "over its seconds per iteration, rounded down; its AP at equal time is that of its runs "
    "of the most iterations within them (a measured run, not interpolated), if those did at "
    "least half of them. Each other schedule the shipped recipe (fcos-d2 recipe) ran gets a "
    "table of its own, with that count as the reference and the recipe's training time "
    "there as the budget.")


def _grouped(numbered: Numbered, key: Callable[[dict], tuple]) -> Dict[tuple, Numbered]:
    groups: Dict[tuple, Numbered] = OrderedDict()
    for line, record in numbered:
        groups.setdefault(key(record), []).append((line, record))
    return groups


def _provenance(group: Numbered) -> List[str]:
    """The cells that trace a row to its records: commits, CPU kinds, record lines."""
    return [_joined(_commit(r) for _, r in group), _joined(_cpu(r) for _, r in group),
            ", ".join(str(line) for line, _ in group)]


def train_quality_table(numbered: Numbered) -> List[str]:
    """Per (regime, overrides, contender): seeds, AP and AP50 mean / std, training s."""
    rows = []
    groups = _grouped(numbered, lambda r: (r["run"].get("regime", "shapes"),
                                           overrides_key(r), r["run"]["contender"]))
    for (regime, overrides, contender), group in groups.items():
        metrics = [r["metrics"] for _, r in group]
        seconds = [r["times"]["train_seconds"] for _, r in group if "train_seconds" in r["times"]]
        rows.append([contender, regime, " ".join(overrides) or "none",
                     _joined(r["seed"] for _, r in group), _mean_std([score(m["AP"]) for m in metrics]),
                     _mean_std([score(m["AP50"]) for m in metrics]),
                     f"{statistics.mean(seconds):.0f}" if seconds else "", *_provenance(group)])
    lines = _table(["contender", "regime", "overrides", "seeds", "AP (mean / std)",
                    "AP50 (mean / std)", "training s (mean)", "commits", "CPU", "records"], rows)
    return lines + equal_time_tables(numbered)


def equal_time_tables(numbered: Numbered) -> List[str]:
    """The runs that counted their iterations at equal iterations and at equal training
    time (``benchmarks.train_quality.equal_time``), a table per comparison; [] if none."""
    found = equal_time.comparisons(numbered)
    if not found:
        return []
    lines = ["", "## At equal iterations and at equal training time", "",
             EQUAL_TIME_DEFINITION]
    for item in found:
        lines += ["", f"{item.title}:", "", *_table(equal_time.HEADER, item.rows)]
    return lines


def masks_table(numbered: Numbered) -> List[str]:
    """Per (data regime, contender, overrides, iterations, how): mask and box AP mean / std
    over seeds (trained runs, and stored runs re-evaluated with changed keys); then AP per
    object size; then the latency records, one row per contender."""
    scored = [(n, r) for n, r in numbered if r["run"].get("kind") in (None, "reevaluate")]
    rows = []
    for (regime, contender, overrides, iters, how), group in _grouped(
            scored, _mask_group).items():
        rows.append([regime, contender, how, " ".join(overrides) or "none", iters,
                     _joined(r["seed"] for _, r in group),
                     _mean_std([r["metrics"]["mask"]["AP"] for _, r in group]),
                     _mean_std([r["metrics"]["box"]["AP"] for _, r in group]),
                     *_provenance(group)])
    lines = _table(["data", "contender", "how", "overrides", "iterations", "seeds",
                    "mask AP (mean / std)", "box AP (mean / std)", "commits", "CPU",
                    "records"], rows)
    lines += masks_by_size_table(numbered)
    latency = [[_mask_regime(r), name, " ".join(r["overrides"]) or "none",
                r["run"].get("iters"), f"{value['ms_per_image']:.1f}", *_provenance([(n, r)])]
               for n, r in numbered if r["run"].get("kind") == "latency"
               for name, value in r["metrics"].items()]
    if latency:
        lines += ["", "Latency of the seed-0 models (one thread, batch 1):", ""]
        lines += _table(["data", "contender", "overrides", "iterations", "ms / image",
                         "commit", "CPU", "record"], latency)
    return lines


def _mask_regime(record: dict) -> str:
    """The record's data regime (``benchmarks.masks.configs.REGIMES``); records made before
    the thin regime existed are the quickstart's."""
    return record["run"].get("mask_regime", "quickstart")


def _mask_group(record: dict) -> tuple:
    how = "re-evaluated" if record["run"].get("kind") == "reevaluate" else "trained"
    return (_mask_regime(record), record["run"]["contender"], tuple(record["overrides"]),
            record["run"].get("iters"), how)


# fcos_d2.modeling.sipmask.mask_cap.SIZE_LABELS (records store them sorted by name)
SIZE_ORDER = ("< 16 px", "16-32 px", "32-64 px", "> 64 px", "all")


def masks_by_size_table(numbered: Numbered) -> List[str]:
    """Mask and box AP per object size (the box's longer side), mean over seeds, from every
    record that has them (a run's own, a later ``--by-size`` one: the latest per run)."""
    latest: Dict[tuple, Tuple[int, dict]] = OrderedDict()
    for line, record in numbered:
        if record["metrics"].get("mask_by_size"):
            latest[(*_mask_group(record), record["seed"])] = (line, record)
    if not latest:
        return []
    rows = []
    for (regime, contender, overrides, iters, how), group in _grouped(
            sorted(latest.values(), key=lambda item: item[1]["seed"]), _mask_group).items():
        found = group[0][1]["metrics"]["mask_by_size"]
        labels = sorted(found, key=lambda k: SIZE_ORDER.index(k) if k in SIZE_ORDER else 99)
        cells = [f"{statistics.mean(r['metrics'][task][label] for _, r in group):.1f}"
                 for task in ("mask_by_size", "box_by_size") for label in labels]
        rows.append([regime, contender, how, " ".join(overrides) or "none", iters,
                     _joined(r["seed"] for _, r in group), *cells, *_provenance(group)])
    header = [f"mask {label}" for label in labels] + [f"box {label}" for label in labels]
    return ["", "AP per object size (the box's longer side, as the mask cap's sizes), mean "
            "over the seeds:", "",
            *_table(["data", "contender", "how", "overrides", "iterations", "seeds", *header,
                     "commits", "CPU", "records"], rows)]


def epochs_table(numbered: Numbered) -> List[str]:
    """Per (regime, overrides, epochs E), E ascending: the final AP over the seeds (mean /
    std, range), the best AP along each run (mean), the seconds of a run (mean)."""
    rows = []
    groups = _grouped(numbered, lambda r: (r["run"]["regime"], overrides_key(r),
                                           r["run"]["epochs"]))
    for (regime, overrides, epochs), group in sorted(groups.items(),
                                                     key=lambda item: item[0]):
        aps = [r["metrics"]["AP"] for _, r in group]
        peaks = [max(ap for _, ap in r["metrics"]["curve"]) for _, r in group]
        seconds = [r["times"]["train_and_eval_seconds"] for _, r in group]
        rows.append([regime, " ".join(overrides) or "none", epochs,
                     _joined(r["seed"] for _, r in group), _mean_std(aps),
                     f"{min(aps):.1f}-{max(aps):.1f}", f"{statistics.mean(peaks):.1f}",
                     f"{statistics.mean(seconds):.0f}", *_provenance(group)])
    lines = _table(["regime", "overrides", "epochs", "seeds", "AP (mean / std)", "AP range",
                    "best AP along the run (mean)", "s / run (mean)", "commits", "CPU",
                    "records"], rows)
    return lines + along_the_longest_runs(groups)


def along_the_longest_runs(groups: Dict[tuple, Numbered]) -> List[str]:
    """Per (regime, overrides), the longest schedule's evaluations along its runs: AP at each
    evaluated epoch, per seed and mean / std (before and after its LR step: the curve that
    tells whether the schedule has reached its plateau)."""
    longest = {}
    for (regime, overrides, epochs), group in groups.items():
        if epochs >= longest.get((regime, overrides), (0, None))[0]:
            longest[(regime, overrides)] = (epochs, group)
    rows = []
    for (regime, overrides), (epochs, group) in sorted(longest.items()):
        curves = [(r["seed"], dict(r["metrics"]["curve"])) for _, r in group]
        for at in sorted({e for _, curve in curves for e in curve}):
            aps = [curve[at] for _, curve in curves if at in curve]
            rows.append([regime, " ".join(overrides) or "none", epochs, f"{at:g}",
                         ", ".join(f"s{seed} {curve[at]:.1f}" for seed, curve in curves
                                   if at in curve), _mean_std(aps)])
    if not rows:
        return []
    return ["", "Along the longest schedule's runs (evaluated every few epochs; s0 12.3: seed "
            "0's AP):", "",
            *_table(["regime", "overrides", "schedule (epochs)", "after epoch", "AP per seed",
                     "AP (mean / std)"], rows)]


def _compact(result: dict) -> str:
    """A result's fields as JSON, floats to 4 significant digits, "row" left out."""
    rounded = {k: float(f"{v:.4g}") if isinstance(v, float) else v
               for k, v in result.items() if k != "row"}
    return json.dumps(rounded, sort_keys=True)


def speed_table(numbered: Numbered) -> List[str]:
    """The timed results (row, contender, batch) of every run, the parts against
    torchvision, the box AP per inference backend, the other results (FLOPs, memory, ...)
    and the target ratios."""
    timed, parts, backend_aps, other, targets = [], [], [], [], []
    for line, record in numbered:
        trace = _provenance([(line, record)])
        threads = record["run"].get("options", {}).get("threads", "")
        device = record["run"].get("machine", {}).get("device", "")
        for r in (r for results in record["metrics"]["rows"].values() for r in results):
            if "seconds" in r and "contender" in r:
                batch = r.get("batch", 1)
                floor = r.get("floor_seconds")  # the arithmetic floor, where the row has one
                timed.append([r["row"], r["contender"], batch, f"{r['seconds'] * 1e3:.1f}",
                              f"{batch / r['seconds']:.2f}",
                              f"{floor * 1e3:.1f}" if floor else "",
                              f"{r['seconds'] / floor:.1f}" if floor else "",
                              device, threads, *trace])
            elif "part" in r:
                ours, theirs = r["fcos_d2_seconds"], r["torchvision_seconds"]
                parts.append([r["part"], f"{ours * 1e3:.1f}", f"{theirs * 1e3:.1f}",
                              f"{theirs / ours:.2f}", device, threads, *trace])
            elif r.get("row") == "backends-ap" and "backend" in r:
                backend_aps.append([*_backend_ap_cells(r), device, threads, *trace])
            else:
                other.append([r.get("row", ""), _compact(r), device, threads, *trace])
        targets += [[name, f"{value:.2f}", *trace]
                    for name, value in record["metrics"].get("targets", {}).items()]
    sections = [
        ("Timed results (floor: the backbone + head FLOPs at the rate of the model's largest "
         "conv in the row's precision, benchmarks/speed/floor.py):",
         ["row", "contender", "batch", "ms / batch", "images / s", "floor ms", "x floor",
          "device", "threads"], timed),
        ("Parts, fcos-d2 against torchvision on the same inputs:",
         ["part", "fcos-d2 ms", "torchvision ms", "torchvision / fcos-d2", "device",
          "threads"], parts),
        ("Box AP per MODEL.FCOS.INFERENCE_BACKEND (backends-ap; eval s: the whole --eval-only "
         "run, compiling and calibrating included):",
         ["model", "weights", "dataset", "backend", "precision", "AP", "AP50", "AP - eager",
          "eval s", "images", "device", "threads"], backend_aps),
        ("Other results:", ["row", "values", "device", "threads"], other),
        ("Target ratios:", ["ratio", "value"], targets)]
    lines = []
    for title, header, rows in sections:
        if rows:
            lines += [title, "", *_table([*header, "commit", "CPU", "record"], rows), ""]
    return lines[:-1]


def _backend_ap_cells(r: dict) -> List[str]:
    """A backends-ap record's cells: model to images; a skipped or failed backend says why
    in its precision cell."""
    if "AP" not in r:
        status = f"skipped: {r['skipped']}" if "skipped" in r else f"failed: {r.get('failed')}"
        return [r["model"], r["weights"], "", r["backend"], status, "", "", "", "", ""]
    return [r["model"], r["weights"], r["dataset"], r["backend"], r["precision"],
            f"{r['AP']:.2f}", f"{r['AP50']:.2f}", f"{r['AP_minus_eager']:+.2f}",
            f"{r['eval_seconds']:.1f}", r["images"]]


def costs_table(numbered: Numbered) -> List[str]:
    """One row per timed model of every cost estimate: its median seconds per training
    iteration and their ratio to the estimate's reference (the recipe, the first regime)."""
    rows = []
    for line, record in numbered:
        medians = record["metrics"]["median_seconds_per_iteration"]
        reference = record["run"].get("reference")
        for name, seconds in medians.items():
            ratio = f"{seconds / medians[reference]:.2f}" if reference in medians else ""
            rows.append([record["run"].get("kind", ""), name, f"{seconds:.3f}", ratio,
                         reference or "", record["run"].get("repeats", ""),
                         *_provenance([(line, record)])])
    return _table(["estimate", "training iteration", "median s", "x reference", "reference",
                   "repeats", "commit", "CPU", "record"], rows)


def size_breakdown_table(numbered: Numbered) -> List[str]:
    """Per record (a trained run): per size bin, COCO AP / AP50 / AP75 / AR@100, the
    class-agnostic AP, and the shares of objects found and named; then each record's
    provenance."""
    from benchmarks.size_breakdown import format_breakdowns

    def label(line: int, r: dict) -> str:
        built = r["run"].get("built_as", r["run"]["contender"])
        name = r["run"]["contender"] + ("" if built == r["run"]["contender"] else f" as {built}")
        ms = r["times"].get("ms_per_image")
        return (f"{name} (seed {r['seed']}, {r['run'].get('iterations')} it"
                + (f", {ms:.1f} ms/image" if ms else "") + f", record {line})")

    rows = [(label(line, r), r["metrics"]) for line, r in numbered]
    provenance = _table(["record", "contender", "regime", "overrides", "trained AP", "commit",
                         "CPU"],
                        [[line, r["run"]["contender"], r["run"].get("regime", "shapes"),
                          " ".join(r["overrides"]) or "none",
                          f"{score(r['run'].get('trained_AP')):.1f}",
                          *_provenance([(line, r)])[:2]] for line, r in numbered])
    return format_breakdowns(rows).splitlines() + [""] + provenance


def generic_table(numbered: Numbered) -> List[str]:
    """One row per record: its seed, overrides, metrics and times as JSON."""
    return _table(["seed", "overrides", "metrics", "times", "commit", "CPU", "record"],
                  [[r["seed"], " ".join(r["overrides"]) or "none",
                    json.dumps(r["metrics"], sort_keys=True), json.dumps(r["times"]),
                    *_provenance([(n, r)])] for n, r in numbered])


def _search_of(command: str) -> str:
    """The search a proxy reward was read from, as its record's command gives it: the NAS
    search's flags after "--", or FAD's --alphas file."""
    words = shlex.split(command)
    if "--" in words:
        return " ".join(words[words.index("--") + 1:])
    return f"--alphas {words[words.index('--alphas') + 1]}" if "--alphas" in words else ""


def search_proxy_table(numbered: Numbered) -> List[str]:
    """One row per record: the member, the contender, its reward under the member's search
    and that search (``_search_of``)."""
    return _table(["member", "contender", "reward", "search", "commit", "CPU", "record"],
                  [[r["run"]["member"], r["run"]["contender"], f"{r['metrics']['reward']:.4f}",
                    _search_of(r["command"]), *_provenance([(n, r)])] for n, r in numbered])


MASK_CAP_SIZES = ("< 16 px", "16-32 px", "32-64 px", "> 64 px", "all", "COCO AP")


def mask_cap_table(numbered: Numbered) -> List[str]:
    """One row per record and settings: the oracle mask AP cap per object size."""
    rows = [[r["run"].get("dataset", "?"), name,
             *(f"{caps[size]:.1f}" if size in caps else "-" for size in MASK_CAP_SIZES),
             *_provenance([(n, r)])]
            for n, r in numbered for name, caps in r["metrics"].items()]
    return _table(["dataset", "settings", *MASK_CAP_SIZES, "commit", "CPU", "record"], rows)


def dcn_offsets_table(numbered: Numbered) -> List[str]:
    """One row per record, model part (a module path's first name) and map size: the mean
    of its convs' mean |offset| and outside fraction, their largest |offset| and mean mask;
    "trained with": the overrides the weights were trained with (the record's)."""
    rows = []
    for line, r in numbered:
        parts: Dict[tuple, List[dict]] = OrderedDict()
        for name, conv in sorted(r["metrics"]["convs"].items(),
                                 key=lambda kv: (kv[0].split(".")[0], -kv[1]["map"][0])):
            parts.setdefault((name.split(".")[0], "x".join(map(str, conv["map"]))), []).append(conv)
        for (part, size), convs in parts.items():
            rows.append([r["run"]["contender"], " ".join(r["overrides"]) or "none",
                         "/".join(Path(r["run"]["weights"]).parts[-2:]), part, size, len(convs),
                         f"{statistics.mean(c['mean_abs_offset'] for c in convs):.2f}",
                         f"{max(c['max_abs_offset'] for c in convs):.1f}",
                         f"{statistics.mean(c['outside'] for c in convs):.0%}",
                         f"{statistics.mean(c['mask'] for c in convs):.2f}",
                         *_provenance([(line, r)])])
    return _table(["contender", "trained with", "weights", "part", "map", "convs",
                   "mean abs offset (px)",
                   "largest (px)", "samples outside the map", "mask", "commit", "CPU",
                   "record"], rows)


# benchmark -> (title, table of its numbered records); others get generic_table
TABLES: Dict[str, Tuple[str, Callable[[Numbered], List[str]]]] = {
    "train_quality": ("Training quality on small data (python -m benchmarks.train_quality)",
                      train_quality_table),
    "masks": ("SipMask against Mask R-CNN (python -m benchmarks.masks)", masks_table),
    "speed": ("Speed of the whole R-50 FCOS (python -m benchmarks.speed)", speed_table),
    "train_quality_costs": ("Cost of a training iteration (python -m benchmarks.train_quality "
                            "--labelenc-cost / --regime-cost)", costs_table),
    "epochs": ("AP against epochs of the small-data recipe (python -m benchmarks.epochs)",
               epochs_table),
    "size_breakdown": ("Where the AP goes, by object size (python -m benchmarks.size_breakdown)",
                       size_breakdown_table),
    "mask_cap": ("SipMask's mask AP cap with perfect boxes and masks "
                 "(python tools/mask_resolution_bound.py --record)", mask_cap_table),
    "dcn_offsets": ("How far deformable convs sample (python -m "
                    "benchmarks.train_quality.offsets)", dcn_offsets_table),
    "search_proxy": ("The searches' rewards of trained contenders (python -m "
                     "benchmarks.train_quality.search_check rewards)", search_proxy_table),
}


def _shown(path: Path) -> str:
    """`path` relative to the repository where it is inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def generate(records_path: Path) -> str:
    """The markdown of the records file `records_path` (``RecordsError`` if it is missing
    or malformed, naming the file and line)."""
    benchmark = Path(records_path).stem
    numbered = read_numbered_records(records_path)
    title, table = TABLES.get(benchmark, (f"{benchmark} records", generic_table))
    header = [f"_Generated from {_shown(records_path)} by python -m benchmarks.tables; do not "
              "edit._", "", f"# {title}", "",
              f"{len(numbered)} records. \"records\": their line numbers in "
              f"{_shown(records_path)}; \"commits\": the checkouts they ran at (+dirty: with "
              "uncommitted changes).", ""]
    return "\n".join(header + table(numbered)) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tables",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, default=RESULTS_DIR,
                        help="folder of the records files (default benchmarks/results)")
    parser.add_argument("--docs", type=Path, default=DOCS_DIR,
                        help="folder of the generated tables (default docs/results)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; fail if a generated table is missing or stale")
    args = parser.parse_args(argv)
    sources = sorted(args.records.glob("*.jsonl"))
    if not sources:
        raise SystemExit(f"{args.records}: no records files (*.jsonl); a benchmark run writes "
                         "them (python -m benchmarks.<name>)")
    stale = []
    for source in sources:
        try:
            text = generate(source)
        except RecordsError as error:
            raise SystemExit(f"python -m benchmarks.tables: {error}") from None
        target = args.docs / f"{source.stem}.md"
        if args.check:
            if not target.is_file() or target.read_text() != text:
                stale.append(str(target))
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target} from {source}")
    derived = {**family_tables.derived_outputs(
        args.records, args.docs, embed=args.docs.resolve() == DOCS_DIR.resolve()),
        **search_tables.derived_outputs(args.records, args.docs)}
    for target, text in derived.items():
        if args.check:
            if not target.is_file() or target.read_text() != text:
                stale.append(str(target))
            continue
        target.write_text(text)
        print(f"wrote {target} (derived from several records files)")
    if stale:
        print(f"stale or missing: {', '.join(stale)}; run python -m benchmarks.tables",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
