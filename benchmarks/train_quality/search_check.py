"""``python -m benchmarks.train_quality.search_check``: do the family's searches earn
their cost? (issue 62). Four commands:

- ``rewards``: each named contender's reward under its member's search, one record each in
  ``benchmarks/results/search_proxy.jsonl``: NAS-FCOS: the proxy task's reward (minus the
  held-out losses after its short training) of the contender's genotype, on the search's
  config and bottom-up (``--bottom-up-weights``: the recipe's trained one); FAD: the
  supernet's score of the contender's genotypes, the sum of the final mixing weights
  (``alphas.json`` of a search) of every chosen edge and operation.
- ``tau``: Kendall's tau (tau-b) between those rewards and the contenders' trained AP
  (their mean over seeds in ``train_quality.jsonl`` at ``--iterations``); target 0.4,
  decided over at least 8 architectures.
- ``compare``: a searched row against its random rows (``family_designed.
  SEARCH_COMPARISONS``): the searched mean and std over seeds, each random genotype's
  mean, and whether the searched beats the random mean by more than its seeds' std;
  ``--print-command`` prints the training command that makes those records.
- ``speedup``: the wall time of a small search with 1 and with 2 data-parallel workers.
"""
import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from benchmarks import records
from benchmarks.records import REPO, score
from benchmarks.table_cells import NO_BF16_NOTE, mixes_cpu_kinds, native_bf16, seeds_cell
from benchmarks.train_quality.family_designed import SEARCH_COMPARISONS, counted_as

PROXY_BENCHMARK = "search_proxy"  # benchmarks/results/search_proxy.jsonl
SPEEDUP_BENCHMARK = "search_speedup"  # benchmarks/results/search_speedup.jsonl
TAU_TARGET = 0.4
COMPARE_SEEDS = 3  # issue 62: the searched and each random row at 3 seeds
TAU_ARCHITECTURES = 8  # issue 62: the tau is read over at least 8 trained architectures
# --cpu: which runs count, by whether their CPU computes bf16 natively (issue 62's targets
# are read on one with it; a CPU without it trains the recipe in float32)
CPU_KINDS: Dict[str, Callable[[dict], bool]] = {
    "all": lambda record: True,
    "native-bf16": lambda record: native_bf16(record) is True,
    "without-bf16": lambda record: native_bf16(record) is False}


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of two equally long sequences: (concordant - discordant pairs) /
    sqrt((pairs - pairs tied in x) * (pairs - pairs tied in y)); NaN when either is
    constant."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"kendall_tau: needs two sequences of the same length >= 2, got "
                         f"{len(x)} and {len(y)}")
    sign = lambda v: (v > 0) - (v < 0)  # noqa: E731
    concordant = discordant = tied_x = tied_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = sign(x[i] - x[j]), sign(y[i] - y[j])
            tied_x += dx == 0
            tied_y += dy == 0
            concordant += dx * dy > 0
            discordant += dx * dy < 0
    pairs = len(x) * (len(x) - 1) // 2
    denominator = math.sqrt((pairs - tied_x) * (pairs - tied_y))
    return (concordant - discordant) / denominator if denominator else float("nan")


def fad_genotype_score(genotypes: Dict[str, object], mixing: Dict[str, list]) -> float:
    """The supernet's score of FAD genotypes {"box", "cls"}: the sum, over both towers'
    nodes and chosen edges (op, source), of the mixing weight ``mixing[tower][node][source]
    [op]`` (``alphas.json``'s last entry: per node (i + 2, len(PRIMITIVES)))."""
    from fcos_d2.modeling.fad.genotypes import PRIMITIVES

    total = 0.0
    for tower, genotype in genotypes.items():
        for node, edges in zip(mixing[tower], genotype.nodes):
            total += sum(node[edge.source][PRIMITIVES.index(edge.op)] for edge in edges)
    return total


def mean_ap(quality: List[dict], name: str, iterations: int,
            cpu: str = "all") -> Optional[Dict]:
    """{"ap": mean, "std", "seeds", "aps", "runs": [(seed, record)]} of the ok shapes runs
    counted as `name` with schedule overrides only (``counted_as``) at `iterations`, from
    CPUs of the kind `cpu` (``CPU_KINDS``), or None without runs; a seed's latest run counts."""
    latest = {r["seed"]: r for r in quality
              if counted_as(r) == (name, ()) and r["run"].get("iterations") == iterations
              and r["run"].get("regime", "shapes") == "shapes"
              and r["run"].get("status", "ok") == "ok" and CPU_KINDS[cpu](r)}
    if not latest:
        return None
    seeds = sorted(latest)
    values = [score(latest[s]["metrics"]["AP"]) for s in seeds]
    return {"ap": statistics.mean(values), "aps": values, "seeds": seeds,
            "runs": [(s, latest[s]) for s in seeds],
            "std": statistics.stdev(values) if len(values) > 1 else float("nan")}


def _mixed(rows) -> bool:
    """Whether the runs of `rows` (``mean_ap``'s, or None) come from both CPU kinds."""
    return mixes_cpu_kinds(r for row in rows if row for _, r in row["runs"])


def compare(quality: List[dict], searched: str, randoms: Sequence[str],
            iterations: int, cpu: str = "all") -> List[str]:
    """The comparison's lines: the searched row and each random row (mean AP over seeds;
    seeds from a CPU without native bf16 marked where both kinds appear, with the mark's
    note), then the verdict (searched mean - random mean against the searched seeds' std)."""
    rows = {name: mean_ap(quality, name, iterations, cpu) for name in [searched, *randoms]}
    mark = _mixed(rows.values())
    lines = [f"| {name} | {seeds_cell(r['runs'], mark)} | {r['ap']:.1f} / {_std(r)} |"
             if r else f"| {name} | - | no runs at {iterations} iterations |"
             for name, r in rows.items()] + ([NO_BF16_NOTE] if mark else [])
    done = [rows[n]["ap"] for n in randoms if rows[n]]
    if not rows[searched] or len(done) < 4:
        return lines + [f"not decided: needs runs of {searched} and of >= 4 random rows"]
    if len(rows[searched]["seeds"]) < 2:
        return lines + [f"not decided: {searched} has one seed, so no std to beat the random "
                        f"mean by ({rows[searched]['ap'] - statistics.mean(done):+.1f} AP)"]
    margin, std = rows[searched]["ap"] - statistics.mean(done), rows[searched]["std"]
    verdict = "beats" if margin > std else "does not beat"
    short = [n for n, r in rows.items() if r and len(r["seeds"]) < COMPARE_SEEDS]
    caveat = (f" (provisional: {', '.join(short)} at fewer than {COMPARE_SEEDS} seeds)"
              if short else "") + (" (CPUs of both kinds: see the mark)" if mark else "")
    return lines + [f"{searched} {verdict} the mean of {len(done)} random genotypes "
                    f"({statistics.mean(done):.1f} AP) by more than its seeds' std: "
                    f"{margin:+.1f} AP against std {std:.1f}{caveat}"]


def _std(row: dict) -> str:
    """A row's seeds' std, or "-" for one seed (no std)."""
    return f"{row['std']:.1f}" if len(row["seeds"]) > 1 else "-"


def training_command(searched: str, iterations: int, steps: int, warmup: int) -> str:
    names = " ".join(f"'{n}'" for n in [searched, *SEARCH_COMPARISONS[searched]])
    return (f"python -m benchmarks.train_quality --contenders {names} --seeds 0 1 2 "
            f"--output output/train_quality_search_check SOLVER.MAX_ITER {iterations} "
            f"SOLVER.STEPS '({steps},)' SOLVER.WARMUP_ITERS {warmup}")


def tau_lines(quality: List[dict], rewards: List[dict], member: str, iterations: int,
              describe: Optional[Callable[[str], str]] = None,
              flops: Optional[Callable[[str], float]] = None, cpu: str = "all") -> List[str]:
    """Each contender with a reward of `member` and trained runs (its name, reward, mean AP,
    seeds and, with `describe`, a cell of ``describe(name)``; with `flops`, one of its
    GFLOPs), then the tau and, with `flops`, the tau of the GFLOPs as a reward (a ranking
    that needs no search to set the proxy's against)."""
    latest = {r["run"]["contender"]: r["metrics"]["reward"] for r in rewards
              if r["run"].get("member") == member}
    pairs = [(name, reward, mean_ap(quality, name, iterations, cpu))
             for name, reward in latest.items()]
    pairs = [(n, reward, ap) for n, reward, ap in pairs if ap]
    costs = {n: flops(n) for n, _, _ in pairs} if flops else {}
    mark = _mixed(ap for _, _, ap in pairs)
    lines = [f"| {n} | {reward:.4f} | {ap['ap']:.1f} | {seeds_cell(ap['runs'], mark)} |"
             + (f" {describe(n)} |" if describe else "")
             + (f" {costs[n]:.3f} |" if flops else "") for n, reward, ap in pairs]
    lines += [NO_BF16_NOTE] if mark else []
    pairs = [(n, reward, ap["ap"]) for n, reward, ap in pairs]
    if len(pairs) < 2:
        return lines + [f"tau: needs >= 2 {member} contenders with a reward and runs at "
                        f"{iterations} iterations ({TAU_ARCHITECTURES} to decide)"]
    aps = [p[2] for p in pairs]
    tau = kendall_tau([p[1] for p in pairs], aps)
    if len(pairs) < TAU_ARCHITECTURES:
        verdict = f"not decided: {len(pairs)} of the {TAU_ARCHITECTURES} architectures needed"
    else:
        verdict = "met" if tau >= TAU_TARGET else "missed"
    lines.append(f"Kendall tau over {len(pairs)} architectures: {tau:.2f} (target "
                 f"{TAU_TARGET}: {verdict})")
    if flops:
        by_cost = kendall_tau([costs[p[0]] for p in pairs], aps)
        lines.append(f"GFLOPs as the reward: Kendall tau {by_cost:.2f}")
    return lines


def nas_architecture(name: str) -> str:
    """The strides at which `name`'s FPN computes P3, P4 and P5 (``native_strides``) and its
    deformable convs in the FPN and the head, e.g. "P3-P5 at 8, 8, 32; DCNs 12 + 2"."""
    from benchmarks.train_quality import catalog
    from fcos_d2.modeling.nas_fcos.genotypes import parse_fpn_genotype

    node = catalog.contender_cfg(name, 0, "unused").MODEL.NAS_FCOS
    fpn = parse_fpn_genotype(node.FPN_GENOTYPE)
    fpn_dcns = sum(op == "def_conv_3x3" for cell in fpn.cells for op in cell.ops)
    head_dcns = sum(op == "def_conv_3x3" for op in node.HEAD_GENOTYPE)
    return (f"P3-P5 at {', '.join(map(str, fpn.native_strides()))}; "
            f"DCNs {fpn_dcns} + {head_dcns}")


def nas_rewards(names: Sequence[str], args) -> Dict[str, float]:
    """The NAS-FCOS search's proxy reward of each contender's genotype (seed 0)."""
    import torch

    from fcos_d2.modeling.nas_fcos.genotypes import parse_fpn_genotype, parse_head_genotype
    from fcos_d2.modeling.nas_fcos.search.__main__ import argument_parser
    from fcos_d2.modeling.nas_fcos.search.proxy import ProxyTask, load_inputs

    from benchmarks.train_quality import catalog
    from detectron2.config import get_cfg
    from fcos_d2 import add_fcos_config

    search = argument_parser().parse_args(args.search_args)
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(search.config_file)
    cfg.merge_from_list(search.opts)  # as the search: its config overrides, then its width
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.NAS_FCOS.CHANNELS", search.channels])
    first = search.first_image
    train = load_inputs(cfg, search.dataset, first, search.train_images)
    val = load_inputs(cfg, search.dataset, first + search.train_images, search.val_images)
    torch.manual_seed(search.seed)
    proxy = ProxyTask(cfg, train, val, iterations=search.proxy_iterations,
                      batch_size=search.batch_size, lr=search.lr,
                      bottom_up_weights=search.bottom_up_weights,
                      offset_lr_factor=cfg.SOLVER.DEFORM_OFFSET_LR_FACTOR)
    rewards = {}
    for name in names:
        node = catalog.contender_cfg(name, 0, "unused").MODEL.NAS_FCOS
        rewards[name] = proxy.reward(parse_fpn_genotype(node.FPN_GENOTYPE),
                                     parse_head_genotype(node.HEAD_GENOTYPE,
                                                         node.HEAD_SHARE_INDEX), seed=0)
    return rewards


def fad_rewards(names: Sequence[str], alphas: Path) -> Dict[str, float]:
    from benchmarks.train_quality import catalog
    from fcos_d2.modeling.fad.config import fad_genotypes

    mixing = json.loads(alphas.read_text())["history"][-1]  # the search's final weights
    return {name: fad_genotype_score(fad_genotypes(catalog.contender_cfg(name, 0, "unused")),
                                     mixing) for name in names}


def speedup(member: str, workers: int, scale: int) -> Dict[int, float]:
    """Wall seconds (process start to end) of the same small search with 1 and with
    `workers` workers: NAS-FCOS ``scale * workers`` FPN and `workers` head samples, FAD
    ``scale`` iterations (each worker takes its share of every batch)."""
    times = {}
    for count in (1, workers):
        with tempfile.TemporaryDirectory() as folder:
            if member == "nas-fcos":
                argv = ["tools/nas_fcos_search.py", "--num-workers", str(count),
                        "--fpn-samples", str(scale * workers), "--head-samples", str(workers),
                        "--output", folder]
            else:
                argv = ["tools/fad_search.py", "--num-gpus", str(count), "--config-file",
                        "configs/FAD/FAD-tiny-search.yaml", "SOLVER.MAX_ITER", str(scale),
                        "OUTPUT_DIR", folder]
            start = time.perf_counter()
            subprocess.run([sys.executable, *argv], cwd=REPO, check=True,
                           stdout=subprocess.DEVNULL)
            times[count] = time.perf_counter() - start
    return times


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.train_quality.search_check",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rewards = sub.add_parser("rewards", help="record each contender's search reward")
    rewards.add_argument("--member", choices=("nas-fcos", "fad"), required=True)
    rewards.add_argument("--contenders", nargs="+", required=True)
    rewards.add_argument("--alphas", type=Path, help="fad: a search's alphas.json")
    rewards.add_argument("search_args", nargs=argparse.REMAINDER,
                         help="nas-fcos: the search's flags (--config-file, "
                              "--bottom-up-weights, --channels, ...) after --")
    tau = sub.add_parser("tau", help="Kendall's tau between the rewards and trained AP")
    tau.add_argument("--member", choices=("nas-fcos", "fad"), required=True)
    comparison = sub.add_parser("compare", help="a searched row against its random rows")
    comparison.add_argument("--searched", choices=sorted(SEARCH_COMPARISONS), required=True)
    comparison.add_argument("--print-command", action="store_true")
    for command in (tau, comparison):
        command.add_argument("--iterations", type=int, required=True,
                             help="the schedule of the runs read (the recipe's 42 epochs: 4200)")
        command.add_argument("--cpu", choices=sorted(CPU_KINDS), default="all",
                             help="read only the runs from CPUs with native bf16, or only "
                                  "those from CPUs without it (default: all; where both "
                                  "appear, the seeds without are marked *)")
    faster = sub.add_parser("speedup", help="a small search with 1 and 2 workers")
    faster.add_argument("--member", choices=("nas-fcos", "fad"), required=True)
    faster.add_argument("--workers", type=int, default=2)
    faster.add_argument("--scale", type=int, default=4,
                        help="nas-fcos: FPN samples a worker; fad: iterations")
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    args = _parser().parse_args(argv)
    read = lambda name: records.read_records(records.records_file(name))  # noqa: E731
    if args.command == "rewards":
        import fcos_d2  # noqa: F401  (before detectron2)

        if args.member == "fad" and not args.alphas:
            raise SystemExit("rewards --member fad: give --alphas SEARCH_OUTPUT/alphas.json")
        args.search_args = [a for a in args.search_args if a != "--"]
        found = (nas_rewards(args.contenders, args) if args.member == "nas-fcos"
                 else fad_rewards(args.contenders, args.alphas))
        command = "python -m benchmarks.train_quality.search_check " + shlex.join(
            sys.argv[1:] if argv is None else argv)
        for name, reward in found.items():
            records.append_record(records.make_record(
                PROXY_BENCHMARK, command=command, seed=0, overrides=[],
                metrics={"reward": reward}, times={},
                run={"contender": name, "member": args.member}))
            print(f"{name}: reward {reward:.4f}")
    elif args.command == "tau":
        import fcos_d2  # noqa: F401  (before detectron2)

        from benchmarks.train_quality.family_costs import contender_gflops

        describe = nas_architecture if args.member == "nas-fcos" else None
        print("\n".join(tau_lines(read("train_quality"), read(PROXY_BENCHMARK), args.member,
                                  args.iterations, describe, contender_gflops, args.cpu)))
    elif args.command == "compare":
        if args.print_command:
            steps, warmup = args.iterations * 5 // 6, args.iterations // 12
            print(training_command(args.searched, args.iterations, steps, warmup))
            return
        print("\n".join(compare(read("train_quality"), args.searched,
                                SEARCH_COMPARISONS[args.searched], args.iterations,
                                args.cpu)))
    else:
        times = speedup(args.member, args.workers, args.scale)
        record = speedup_record(times, args, "python -m benchmarks.train_quality.search_check "
                                + shlex.join(sys.argv[1:] if argv is None else argv))
        records.append_record(record)
        print(f"{args.member} search: 1 worker {times[1]:.1f} s, {args.workers} workers "
              f"{times[args.workers]:.1f} s: speed-up {record['metrics']['speedup']:.2f}x "
              f"(wall, process start to end; CPU {records.cpu_kind()})")


def speedup_record(times: Dict[int, float], args, command: str) -> dict:
    """The record of a ``speedup`` measurement: both wall times and their ratio."""
    return records.make_record(
        SPEEDUP_BENCHMARK, command=command, seed=None, overrides=[],
        metrics={"seconds_1_worker": round(times[1], 1),
                 f"seconds_{args.workers}_workers": round(times[args.workers], 1),
                 "speedup": times[1] / times[args.workers]},
        times={}, run={"member": args.member, "workers": args.workers, "scale": args.scale})


if __name__ == "__main__":
    main()
