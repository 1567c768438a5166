"""The command of the AP-against-epochs benchmark (``python -m benchmarks.epochs``; what it
measures is described in ``benchmarks/epochs/__init__.py``).

The parent generates the regime's data, chooses the (E, seed) runs not yet in
``OUTPUT/results.jsonl`` and runs each in a child process (``benchmarks.runner.run_all``):
``--run e<E> --seed SEED``; a child trains it (``curve.run_one``). Then the parent writes and
prints the table of the runs there (``benchmarks.tables.epochs_table``).
"""
import argparse
import shlex
import sys
from pathlib import Path
from typing import Dict, List, Optional

import benchmarks.epochs as package
from benchmarks import tables
from benchmarks.epochs import curve
from benchmarks.records import read_numbered_records
from benchmarks.runner import add_child_arguments, module_command, run_all
from benchmarks.train_quality import protocol

MODULE = "benchmarks.epochs"


def settings_of(args, epochs: int) -> Dict:
    """The ``curve.SETTINGS`` of the run of `epochs` epochs under the command's `args`."""
    return {"regime": args.regime, "epochs": epochs, "eval_every": args.eval_every,
            "train_images": args.train_images, "val_images": args.val_images}


def stored_runs(results: Path, args) -> List[tuple]:
    """(line, record) of every run in `results` made with the command's settings but for
    the epochs (any E, any seed) and with its overrides: the runs of its table."""
    if not results.is_file():
        return []
    common = {k: v for k, v in settings_of(args, 0).items() if k != "epochs"}
    return [(line, record) for line, record in read_numbered_records(results)
            if record["overrides"] == args.opts
            and all(record["run"].get(k) == v for k, v in common.items())]


def missing_runs(results: Path, args) -> List[tuple]:
    """(E, seed) of every run of the command that `results` does not hold yet."""
    stored = [record for _, record in stored_runs(results, args)]
    return [(e, s) for e in args.epochs for s in args.seeds
            if not any(curve.is_run_of(r, settings_of(args, e), s, args.opts) for r in stored)]


def run_child(args, output: Path, command: str) -> None:
    """One (E, seed) run, ``--run e<E> --seed SEED``."""
    import fcos_d2  # noqa: F401  (before detectron2)

    if not args.run.startswith("e") or not args.run[1:].isdigit():
        raise SystemExit(f"--run {args.run}: expected e<epochs>, e.g. e12")
    curve.run_one(settings_of(args, int(args.run[1:])), args.seed, output, args.opts, command,
                  args.threads)


def parse_args(argv: List[str]) -> argparse.Namespace:
    """The command's arguments, the image counts the regime's where not given."""
    args = _parser().parse_args(argv)
    default_images = curve.regime_images(args.regime)
    args.train_images = args.train_images or default_images["train"]
    args.val_images = args.val_images or default_images["val"]
    return args


def main(argv: Optional[List[str]] = None) -> str:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    output = Path(args.output or protocol.REPO / "output" / f"epochs_curve_{args.regime}")
    command = f"python -m {MODULE} {shlex.join(argv)}"
    if args.run:
        run_child(args, output, command)
        return ""
    import fcos_d2  # noqa: F401

    folders = curve.data_folders(args.regime, {"train": args.train_images,
                                               "val": args.val_images})  # once, here
    output.mkdir(parents=True, exist_ok=True)
    results = output / "results.jsonl"
    todo = missing_runs(results, args)
    if args.dry_run:
        for epochs, seed in todo:
            print(shlex.join([sys.executable, "train_net.py", *curve.trainer_argv(
                args.regime, folders, seed, epochs, args.eval_every, output, args.opts)]))
        return ""
    extra = ["--regime", args.regime, "--eval-every", str(args.eval_every), "--threads",
             str(args.threads), "--train-images", str(args.train_images), "--val-images",
             str(args.val_images)]
    run_all([(f"e{e}", s) for e, s in todo], args.jobs, output, args.opts,
            module_command(MODULE), extra_args=extra)
    failed = missing_runs(results, args)
    if failed:
        logs = ", ".join(str(output / f"log-e{e}-{s}.txt") for e, s in failed)
        raise SystemExit(f"{len(failed)} run(s) left no record in {results}; their logs: {logs}")
    table = "\n".join(tables.epochs_table(stored_runs(results, args)))
    (output / "table.md").write_text(table + "\n")
    print(table)
    return table


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                     description=package.__doc__.split("\n\n")[0])
    parser.add_argument("--regime", choices=sorted(protocol.REGIMES), default="shapes")
    parser.add_argument("--epochs", type=int, nargs="+", default=[12, 24, 36, 48])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-every", type=int, default=4, help="epochs between evaluations")
    parser.add_argument("--threads", type=int, default=1, help="threads of a run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once")
    parser.add_argument("--train-images", type=int, default=None,
                        help="first N train images (default: the regime's, 400)")
    parser.add_argument("--val-images", type=int, default=None,
                        help="first N val images (default: the regime's, 100)")
    parser.add_argument("--output", default=None, help="default output/epochs_curve_<regime>")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the trainer command of every run to do, run none")
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[],
                        help="KEY VALUE overrides for every run (stored runs count only "
                             "with the same overrides)")
    add_child_arguments(parser)  # child: one E and one seed
    return parser


if __name__ == "__main__":
    main()
