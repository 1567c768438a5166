"""The command of the training-quality benchmark (``python -m benchmarks.train_quality``;
the protocol and every mode are described in ``benchmarks/train_quality/__init__.py``).

The parent chooses the (contender, seed) runs not yet in ``OUTPUT/results.jsonl`` and runs
each in a child process (``benchmarks.runner.run_all``): ``--run NAME --seed SEED``. A child
trains and evaluates one contender (``Contender.run``), appends its results there and a
record of each to ``benchmarks/results/train_quality.jsonl`` (``benchmarks.records``).
"""
import argparse
import shlex
import sys
from collections import OrderedDict
from pathlib import Path
from typing import List, Optional, Set, Tuple

import benchmarks.train_quality as package
from benchmarks import records
from benchmarks.runner import add_child_arguments, append_results, module_command, run_all
from benchmarks.train_quality import analyses, catalog, costs, family_costs, protocol
from benchmarks.train_quality.labelenc import LABELENC, missing_step1
from benchmarks.train_quality.results import (checked_results, other_overrides,
                                              repository_record, summarise, summarise_times)

MODULE = "benchmarks.train_quality"
REPO = protocol.REPO


def run_one(name: str, seed: int, output_dir: str, opts: List[str], regime: str = "shapes",
            diagnostics: bool = False, init_seed: Optional[int] = None,
            step1_from: Optional[str] = None) -> List[dict]:
    """Trains contender `name` with `seed` in `regime` (``Contender.run``, with its
    inference-only variants); returns its records. Records of a regime other than "shapes"
    carry its name ("regime"), those of a run with `init_seed` carry it, and every record
    carries the overrides it ran with ("opts")."""
    import torch

    torch.set_num_threads(1)
    protocol.register_datasets(regime)
    tag = {"opts": [str(o) for o in opts], **({} if regime == "shapes" else {"regime": regime})}
    if init_seed is not None:
        tag["init_seed"] = init_seed
    results = catalog.contender(name).run(
        seed, output_dir, opts, regime, diagnostics=diagnostics, init_seed=init_seed,
        step1_from=step1_from, also_evaluate=catalog.inference_variants_of(name))
    return [{**result, **tag} for result in results]


def step2_can_start(step2_waits: bool):
    """``run_all``'s test: a contender that waits for another's run of its seed (a LabelEnc
    step-2 variant) starts once that run is no longer waiting, unless not `step2_waits`
    (its step 1 comes from elsewhere)."""
    def can_start(name: str, seed: int, waiting: Set[Tuple[str, int]]) -> bool:
        waits_for = catalog.contender(name).waits_for
        return not step2_waits or waits_for is None or (waits_for, seed) not in waiting
    return can_start


def run_benchmark(chosen: List[str], names: List[str], args, output: Path,
                  command: Optional[List[str]] = None) -> None:
    """Runs the (contender, seed) pairs of `chosen` x the seeds not yet in
    ``output/results.jsonl`` (children run `command`, default this module), then writes and
    prints the table of every contender there."""
    output.mkdir(parents=True, exist_ok=True)
    results = checked_results(output / "results.jsonl", args.regime)
    clash = other_overrides(results, args.opts)
    if clash:  # its runs would count as done, and one table would mix two settings
        raise SystemExit(f"{output / 'results.jsonl'}: {clash}; use another --output for "
                         "these overrides")
    protocol.prepare_datasets(args.regime)
    done = {(r["contender"], r["seed"]) for r in results}
    # an inference-only variant comes with its base contender's run
    to_train = list(OrderedDict.fromkeys(catalog.contender(c).trained_by or c for c in chosen))
    seeds = args.seeds or protocol.REGIMES[args.regime].seeds
    todo = [(c, s) for s in seeds for c in to_train if (c, s) not in done]
    extra = [*(["--regime", args.regime] if args.regime != "shapes" else []),
             *(["--diagnostics"] if args.diagnostics else []),
             *(["--init-seed", str(args.init_seed)] if args.init_seed is not None else []),
             *(["--step1-from", str(args.step1_from)] if args.step1_from else [])]
    run_all(todo, args.jobs, output, args.opts, command or module_command(MODULE),
            extra_args=extra, can_start=step2_can_start(not args.step1_from))
    # every contender with runs in the file, also those of earlier invocations
    results = checked_results(output / "results.jsonl", args.regime)
    table = summarise(results, names) + "\n\n" + summarise_times(results, names)
    (output / "table.md").write_text(table + "\n")
    print(table)
    if any(r.get("diagnostics") for r in results):
        from benchmarks.train_quality.diagnostics import summarise_diagnostics

        diagnostics = summarise_diagnostics(results, names)
        (output / "diagnostics.md").write_text(diagnostics + "\n")
        print("\n" + diagnostics)


def run_child(args, output: Path, argv: List[str]) -> None:
    """One (contender, seed) run: its results go to ``output/results.jsonl`` and a record
    of each to the repository's records file."""
    import fcos_d2  # noqa: F401  (before detectron2)

    from benchmarks.train_quality.resume import RESUME_FILE

    folder = output / "runs" / f"{args.run}-{args.seed}"
    results = run_one(args.run, args.seed, str(folder), args.opts, regime=args.regime,
                      diagnostics=args.diagnostics, init_seed=args.init_seed,
                      step1_from=args.step1_from)
    append_results(output / "results.jsonl", results)
    command = f"python -m {MODULE} {shlex.join(argv)}"
    for result in results:
        records.append_record(repository_record(result, command))
    (folder / RESUME_FILE).unlink(missing_ok=True)  # recorded: a new start trains anew


def cost_estimate(args, argv: List[str]) -> str:
    """--labelenc-cost, --regime-cost or --contender-cost: the table, after recording the
    medians."""
    import fcos_d2  # noqa: F401  (before detectron2)

    if args.labelenc_cost:
        kind, repeats = "labelenc-cost", args.labelenc_cost
        medians = costs.labelenc_iteration_seconds(repeats)
        table = costs.labelenc_cost_table(medians)
    elif args.contender_cost:
        kind, repeats = "contender-cost", args.contender_cost
        medians = costs.contender_iteration_seconds(args.contenders, repeats, args.regime)
        table = costs.contender_cost_table(medians)
    else:
        kind, repeats = "regime-cost", args.regime_cost
        medians = costs.regime_iteration_seconds(repeats)
        table = costs.regime_cost_table(medians)
    records.append_record(costs.cost_record(kind, medians, repeats,
                                            f"python -m {MODULE} {shlex.join(argv)}"))
    return table


def family_cost_estimate(args, argv: List[str]) -> str:
    """--family-costs RUNS: parameters, GFLOPs and CPU latency of the family's contenders
    (or of --contenders), recorded, then their table."""
    import fcos_d2  # noqa: F401  (before detectron2)

    chosen = catalog.family_names() if args.contenders in (["all"], ["family"]) \
        else catalog.designed_names() if args.contenders == ["designed"] else args.contenders
    measured = family_costs.measure(chosen, args.family_costs, args.threads_per_cost)
    for record in family_costs.cost_records(measured, args.family_costs, args.threads_per_cost,
                                            f"python -m {MODULE} {shlex.join(argv)}"):
        records.append_record(record)
    return family_costs.costs_table(measured)


def _read_only_modes(args, output: Path, argv: List[str]) -> Optional[str]:
    """The output of a mode that trains nothing, None if none was asked for."""
    chosen = None if args.contenders == ["all"] else args.contenders
    if args.labelenc_cost or args.regime_cost or args.contender_cost:
        if args.contender_cost and args.contenders == ["all"]:
            raise SystemExit("--contender-cost: name the contenders to time (--contenders A B)")
        return cost_estimate(args, argv)
    if args.family_costs:
        return family_cost_estimate(args, argv)
    if args.positives:
        import fcos_d2  # noqa: F401  (before detectron2)

        return analyses.positives_table(args.regime, chosen or catalog.POSITIVES_CONTENDERS)
    if args.reevaluate:
        return analyses.reevaluate_runs(args.regime, output, args.reevaluate, chosen)
    if args.weight_growth:
        return analyses.weight_growth_runs(output, chosen)
    return None


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    output = Path(args.output or REPO / "output" / protocol.REGIMES[args.regime].output)
    if args.init_seed is not None and not args.output:
        output = output / f"init_seed_{args.init_seed}"
    if args.run:
        return run_child(args, output, argv)
    names = catalog.contender_names()
    if not catalog.has_detectron2_fcos():
        print("the installed detectron2 has no detectron2.modeling.meta_arch.fcos: the "
              "'detectron2' contender is left out")
        names = [n for n in names if n.split("+")[0] != catalog.DETECTRON2]
    if args.list and not (args.labelenc_cost or args.regime_cost or args.contender_cost):
        print("\n".join(names))
        return
    printed = _read_only_modes(args, output, argv)
    if printed is not None:
        print(printed)
        return
    groups = {"family": catalog.family_names, "designed": catalog.designed_names}
    chosen = catalog.default_contenders(names, args.regime) if args.contenders == ["all"] \
        else groups[args.contenders[0]]() if args.contenders[0] in groups \
        and len(args.contenders) == 1 else args.contenders
    unknown = [c for c in chosen if c not in names]
    if unknown:
        parser.error(f"unknown contenders {unknown}; --list prints the names")
    if args.step1_from and any(catalog.contender(c).waits_for for c in chosen):
        missing = [missing_step1(Path(args.step1_from), seed, args.regime, args.opts)
                   for seed in args.seeds or protocol.REGIMES[args.regime].seeds]
        if any(missing):
            parser.error(f"--step1-from {args.step1_from}: {'; '.join(filter(None, missing))}")
    run_benchmark(chosen, names, args, output)
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                     description=package.__doc__.split("\n\n")[0])
    parser.add_argument("--regime", choices=sorted(protocol.REGIMES), default="shapes",
                        help="shapes: 128-px shapes, 6 classes (default); thin: 256-352 px "
                             "images, 10 classes of thin and filled objects")
    parser.add_argument("--contenders", nargs="+", default=["all"],
                        help="names as --list prints them, 'all', 'family' (FCOS's head, "
                             "Faster R-CNN, RetinaNet, NAS-FCOS's and FAD's rows) or "
                             "'designed' (FCOS's head and the members as designed)")
    parser.add_argument("--seeds", nargs="+", type=int,
                        help="default: the regime's (shapes 0 1 2, thin 0 1 2 3 4)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    parser.add_argument("--output", help="default output/train_quality (shapes), "
                                         "output/train_quality_thin (thin)")
    parser.add_argument("--diagnostics", action="store_true",
                        help="record per run losses over training, positives per level, "
                             "gradient norms, BN statistics, regression outputs and the "
                             "positives' scores (benchmarks/train_quality/diagnostics.py)")
    parser.add_argument("--list", action="store_true", help="print the contenders and exit")
    parser.add_argument("--labelenc-cost", type=int, metavar="REPEATS",
                        help="time training iterations of the recipe and LabelEnc's steps "
                             "side by side (REPEATS rounds), print the table and exit")
    parser.add_argument("--family-costs", type=int, metavar="RUNS",
                        help="parameters, GFLOPs and CPU latency per image (median of RUNS "
                             "rounds) of the family's contenders (or --contenders), recorded "
                             "in benchmarks/results/family_costs.jsonl; print and exit")
    parser.add_argument("--threads-per-cost", type=int, default=1,
                        help="threads of --family-costs (default 1)")
    parser.add_argument("--positives", action="store_true",
                        help="count where the assignment of fcos-d2 contenders (--contenders, "
                             "default: official, recipe, atss, recipe+atss-anchors-4) puts "
                             "the positives of the regime's training images, print, exit")
    parser.add_argument("--contender-cost", type=int, metavar="REPEATS",
                        help="time training iterations of --contenders side by side in the "
                             "--regime (each with its optimizer and AMP; REPEATS rounds), "
                             "print the table and exit")
    parser.add_argument("--regime-cost", type=int, metavar="REPEATS",
                        help="time training iterations of the recipe in every regime side "
                             "by side (REPEATS rounds), print the table and exit")
    parser.add_argument("--reevaluate", type=int, metavar="N",
                        help="score every stored run's weights (of --contenders) on the N "
                             "validation images after the regime's first ones, write "
                             "OUTPUT/reevaluated.jsonl, print the table of both and exit "
                             "(benchmarks/train_quality/reevaluate.py)")
    parser.add_argument("--weight-growth", action="store_true",
                        help="print how far training grew the backbone's conv weight norms "
                             "in every stored run (of --contenders), beside its AP and stem "
                             "BN statistics, and exit (benchmarks/train_quality/diagnostics.py)")
    parser.add_argument("--init-seed", type=int, metavar="N",
                        help="initialise the weights from seed N in every run, while each "
                             "run's seed still draws the image order and augmentation: "
                             "tells initialisation from data as a source of variance "
                             "(default output: the regime's folder / init_seed_N)")
    parser.add_argument("--step1-from", metavar="DIR",
                        help="LabelEnc's step-2 variants start from the step 1 of the "
                             f"'{LABELENC}' runs in DIR (an earlier --output of the same "
                             "regime) instead of training it in this --output")
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[],
                        help="config overrides for every contender (KEY VALUE ...); runs "
                             "with other overrides (MODEL.DEVICE aside) need another "
                             "--output: the command refuses to mix them")
    add_child_arguments(parser)  # child: one contender and one seed
    return parser
