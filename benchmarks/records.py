"""Results records: one JSON object a line, appended to ``benchmarks/results/<benchmark>.jsonl``.

A record says what ran and where, so that a figure in the docs can be traced to its run:

- ``benchmark``: the file's name (``train_quality``, ``masks``, ``speed``);
- ``date``: when the record was written (UTC, ISO 8601);
- ``commit``: the checkout's HEAD, and ``dirty``: whether tracked files differed from it
  (the records files themselves aside);
- ``cpu``: the CPU kind as /proc/cpuinfo names it, its bf16 and AMX flags and the core count;
- ``command``: the command line that ran;
- ``seed``, ``overrides`` (config KEY VALUE ... as strings), ``metrics`` and ``times``
  (seconds), and ``run``: anything else the benchmark keeps (contender, regime, status, ...);
- ``recipe``: the digest of the small-data recipe's config files (records since issue 60).

``FCOS_D2_RECORDS_DIR`` names another folder for the records files (the tests point it at a
temporary one, so that they never write into the repository).
"""
import datetime
import hashlib
import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
RECORDS_DIR_ENV = "FCOS_D2_RECORDS_DIR"
REQUIRED_KEYS = ("benchmark", "date", "commit", "cpu", "command", "seed", "overrides",
                 "metrics", "times")
# /proc/cpuinfo flags that decide the speed of bf16 (native bf16 dot products, AMX tiles)
CPU_FLAG_MARKS = ("bf16", "amx")


class RecordsError(ValueError):
    """A records file that is missing or holds a line that is not a record."""


def records_file(benchmark: str) -> Path:
    """The records file of `benchmark`: under ``$FCOS_D2_RECORDS_DIR`` if set, else under
    benchmarks/results/ of this checkout."""
    folder = os.environ.get(RECORDS_DIR_ENV)
    return (Path(folder) if folder else RESULTS_DIR) / f"{benchmark}.jsonl"


def cpu_kind(cpuinfo: str = "/proc/cpuinfo") -> Dict[str, Any]:
    """{"model": the first "model name" of `cpuinfo` ("unknown" where there is none),
    "flags": its flags naming bf16 or AMX, sorted, "cores": os.cpu_count()}."""
    model, flags = "unknown", set()
    path = Path(cpuinfo)
    for line in path.read_text().splitlines() if path.is_file() else []:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown":
            model = value.strip()
        elif key in ("flags", "Features"):  # x86, ARM
            flags.update(f for f in value.split() if any(m in f for m in CPU_FLAG_MARKS))
    return {"model": model, "flags": sorted(flags), "cores": os.cpu_count()}


def git_state(repo: Path = REPO) -> Tuple[str, bool]:
    """(HEAD's hash, whether tracked files outside benchmarks/results/ differ from it);
    ("unknown", False) outside a git checkout."""
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    if head.returncode != 0:
        return "unknown", False
    changed = subprocess.run(["git", "-C", str(repo), "status", "--porcelain",
                              "--untracked-files=no", "--", ".",
                              ":(exclude)benchmarks/results"], capture_output=True, text=True)
    return head.stdout.strip(), bool(changed.stdout.strip())


# The small-data recipe's config files: a record names their digest ("recipe"), so that the
# tables never pool runs of two versions of the recipe under one set of overrides.
RECIPE_FILES = ("configs/FCOS-R18-small-data.yaml", "configs/Base-FCOS.yaml")


def recipe_digest(repo: Path = REPO) -> str:
    """The first 8 hex digits of the sha256 of the recipe's config files, as they are now."""
    digest = hashlib.sha256()
    for name in RECIPE_FILES:
        path = repo / name
        digest.update(path.read_bytes() if path.is_file() else b"")
    return digest.hexdigest()[:8]


def overrides_key(record: Dict[str, Any]) -> Tuple[str, ...]:
    """A record's overrides, with its recipe digest where it has one ("[recipe abcd1234]"):
    the key that the tables group runs by. Records made before the digest existed have
    none."""
    recipe = record.get("recipe")
    return tuple(record["overrides"]) + ((f"[recipe {recipe}]",) if recipe else ())


def make_record(benchmark: str, *, command: str, seed: Optional[int],
                overrides: Sequence, metrics: Dict[str, Any], times: Dict[str, float],
                run: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A record of one run of `benchmark` on this machine and checkout (module docstring)."""
    commit, dirty = git_state()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {"benchmark": benchmark, "date": date, "commit": commit, "dirty": dirty,
            "cpu": cpu_kind(), "command": command, "seed": seed,
            "overrides": [str(o) for o in overrides], "metrics": metrics, "times": times,
            "run": run or {}, "recipe": recipe_digest()}


def append_record(record: Dict[str, Any], path: Optional[Path] = None) -> Path:
    """Appends `record` as one line to `path` (default: its benchmark's records file) in one
    write, so that runs in parallel processes never interleave; returns the path."""
    path = Path(path or records_file(record["benchmark"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    return path


def read_numbered_records(path: Path) -> List[Tuple[int, Dict[str, Any]]]:
    """(1-based line number, record) of every non-blank line of the records file `path`.

    Raises:
        RecordsError: the file is missing, or a line is not a JSON object holding every
            key of REQUIRED_KEYS (the message names the file and the line).
    """
    path = Path(path)
    if not path.is_file():
        raise RecordsError(f"{path}: no such records file; a benchmark run writes it "
                           "(python -m benchmarks.<name>)")
    numbered = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise RecordsError(f"{path}, line {number}: not JSON ({error}); fix or delete "
                               "the line") from None
        if not isinstance(record, dict):
            raise RecordsError(f"{path}, line {number}: a {type(record).__name__}, not a "
                               "record (a JSON object); fix or delete the line")
        missing = [key for key in REQUIRED_KEYS if key not in record]
        if missing:
            raise RecordsError(f"{path}, line {number}: the record lacks {missing}; fix or "
                               "delete the line")
        numbered.append((number, record))
    return numbered


def read_records(path: Path) -> List[Dict[str, Any]]:
    """The records of `path` (``read_numbered_records`` without the line numbers)."""
    return [record for _, record in read_numbered_records(path)]


def score(value) -> float:
    """A recorded AP-like value for tables: NaN, which detectron2's COCOEvaluator reports
    when a model made no detection at all, counts as 0.0 (nothing found)."""
    value = float(value)
    return 0.0 if math.isnan(value) else value
