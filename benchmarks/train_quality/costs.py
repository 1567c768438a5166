"""Cost estimates of the training-quality benchmark: the seconds of one training iteration
of the recipe beside LabelEnc's steps (``--labelenc-cost``), and of the recipe in each regime
(``--regime-cost``), timed in turn in one process so that other load hits all alike. Each
estimate is recorded in benchmarks/results/train_quality_costs.jsonl."""
import statistics
import time
from typing import Dict, List

from benchmarks import records
from benchmarks.train_quality import labelenc, protocol
from benchmarks.train_quality.catalog import contender, contender_cfg
from benchmarks.train_quality.contenders import RECIPE

COSTS_BENCHMARK = "train_quality_costs"  # benchmarks/results/train_quality_costs.jsonl


def timed_rounds(models: Dict, optimizers: Dict, batches: Dict, repeats: int,
                  storage_iter: int, autocast: Dict = None) -> Dict[str, List[float]]:
    """Seconds of `repeats` training iterations (forward, backward, step) of each model on
    ``batches[name](round)``, the models in turn each round, after a warm-up round; in an
    event storage at iteration `storage_iter`; the forward in bf16 autocast for the names
    `autocast` maps to True."""
    import contextlib

    import torch
    from detectron2.utils.events import EventStorage

    seconds = {name: [] for name in models}
    with EventStorage(storage_iter):
        for round_ in range(repeats + 1):  # round 0 warms up
            for name, model in models.items():
                start = time.perf_counter()
                with (torch.autocast("cpu", dtype=torch.bfloat16) if (autocast or {}).get(name)
                      else contextlib.nullcontext()):
                    losses = model(batches[name](round_))
                optimizers[name].zero_grad()
                sum(losses.values()).backward()
                optimizers[name].step()
                if round_:
                    seconds[name].append(time.perf_counter() - start)
    return seconds


def labelenc_iteration_seconds(repeats: int) -> Dict[str, float]:
    """The median seconds of one training iteration (forward, backward, SGD step; the first
    batch of the protocol's loader; one thread) of the recipe and of LabelEnc's steps with
    their extra losses on (step 1 also LEF-only)."""
    import torch
    from detectron2.data import build_detection_train_loader

    from fcos_d2.engine.optimizer import build_optimizer

    torch.set_num_threads(1)
    protocol.register_datasets()
    lef_only = contender(labelenc.LABELENC_LEF_ONLY)
    configs = {RECIPE: contender_cfg(RECIPE, 0, "unused"),
               "LabelEnc step 1": contender_cfg(labelenc.LABELENC, 0, "unused", labelenc_step=1),
               "LabelEnc step 1, LEF only": lef_only.step_config(1, 0, "unused"),
               "LabelEnc step 2": contender_cfg(labelenc.LABELENC, 0, "unused", labelenc_step=2)}
    models = {k: contender(RECIPE if k == RECIPE else labelenc.LABELENC).build(cfg).train()
              for k, cfg in configs.items()}
    optimizers = {k: build_optimizer(configs[k], model) for k, model in models.items()}
    batch = next(iter(build_detection_train_loader(configs[RECIPE])))
    # at this iteration step 1's distance loss and step 2's auxiliary loss are both on
    seconds = timed_rounds(models, optimizers, {k: lambda _: batch for k in models}, repeats,
                            labelenc.LABELENC_WARMUP)
    return {name: statistics.median(s) for name, s in seconds.items()}


def labelenc_cost_table(medians: Dict[str, float]) -> str:
    """A markdown table of ``labelenc_iteration_seconds``: each as a multiple of the
    recipe's too."""
    rows = ["| training iteration | median s | x recipe |", "|---|---|---|"]
    rows += [f"| {name} | {s:.3f} | {s / medians[RECIPE]:.2f} |" for name, s in medians.items()]
    return "\n".join(rows)


def regime_iteration_seconds(repeats: int) -> Dict[str, float]:
    """The median seconds of one training iteration (forward, backward, SGD step; one
    thread) of the recipe in each regime, on the first `repeats` batches of the regime's
    loader (after one warm-up iteration each)."""
    import itertools

    import torch
    from detectron2.data import build_detection_train_loader

    from fcos_d2.engine.optimizer import build_optimizer

    torch.set_num_threads(1)
    configs, models, optimizers, batches = {}, {}, {}, {}
    for regime in protocol.REGIMES:
        protocol.register_datasets(regime)
        configs[regime] = contender_cfg(RECIPE, 0, "unused", regime=regime)
        models[regime] = contender(RECIPE).build(configs[regime]).train()
        optimizers[regime] = build_optimizer(configs[regime], models[regime])
        loader = build_detection_train_loader(configs[regime])
        batches[regime] = list(itertools.islice(iter(loader), repeats + 1)).__getitem__
    seconds = timed_rounds(models, optimizers, batches, repeats, 0)
    return {regime: statistics.median(s) for regime, s in seconds.items()}


def regime_cost_table(medians: Dict[str, float]) -> str:
    """A markdown table of ``regime_iteration_seconds``: each as a multiple of "shapes"'s,
    with the minutes of a run of the protocol's length."""
    rows = ["| regime | median s per iteration | x shapes | est. min per run (600 it.) |",
            "|---|---|---|---|"]
    rows += [f"| {regime} | {s:.3f} | {s / medians['shapes']:.2f} | "
             f"{s * protocol.REGIME[1] / 60:.0f} |" for regime, s in medians.items()]
    return "\n".join(rows)


def contender_iteration_seconds(names: List[str], repeats: int,
                                regime: str = "shapes") -> Dict[str, float]:
    """The median seconds of one training iteration (forward, backward, optimizer step; one
    thread; the first `repeats` batches of the regime's loader after a warm-up) of each
    contender of `names` as the protocol trains it (its optimizer, bf16 autocast where its
    config enables AMP and the CPU has native bf16), the contenders in turn."""
    import itertools

    import torch
    from detectron2.data import build_detection_train_loader

    from fcos_d2.engine.amp import cpu_autocast_dtype
    from fcos_d2.engine.optimizer import build_optimizer

    torch.set_num_threads(1)
    protocol.register_datasets(regime)
    configs = {name: contender_cfg(name, 0, "unused", regime=regime) for name in names}
    models = {name: contender(name).build(cfg).train() for name, cfg in configs.items()}
    optimizers = {name: build_optimizer(configs[name], models[name]) for name in names}
    autocast = {name: cfg.SOLVER.AMP.ENABLED and cpu_autocast_dtype(
        torch.bfloat16, cfg.MODEL.FCOS.CPU_BF16, what="training",
        key="SOLVER.AMP.ENABLED") == torch.bfloat16 for name, cfg in configs.items()}
    loader = build_detection_train_loader(configs[names[0]])
    batches = list(itertools.islice(iter(loader), repeats + 1))
    seconds = timed_rounds(models, optimizers, {n: batches.__getitem__ for n in names},
                           repeats, 0, autocast)
    return {name: statistics.median(s) for name, s in seconds.items()}


def contender_cost_table(medians: Dict[str, float]) -> str:
    """A markdown table of ``contender_iteration_seconds``: each as a multiple of the
    first's."""
    first = next(iter(medians.values()))
    rows = ["| contender | median s per iteration | x first |", "|---|---|---|"]
    rows += [f"| {name} | {s:.3f} | {s / first:.2f} |" for name, s in medians.items()]
    return "\n".join(rows)


# what each estimate's medians are divided by in its table
COST_REFERENCES = {"labelenc-cost": RECIPE, "regime-cost": "shapes",
                   "contender-cost": "the first contender"}


def cost_record(kind: str, medians: Dict[str, float], repeats: int, command: str) -> dict:
    """The ``benchmarks.records`` record of a cost estimate (`kind`: "labelenc-cost" or
    "regime-cost"), in its own records file (train_quality_costs.jsonl)."""
    return records.make_record(
        COSTS_BENCHMARK, command=command, seed=0, overrides=[],
        metrics={"median_seconds_per_iteration": medians}, times={},
        run={"kind": kind, "repeats": repeats, "reference": COST_REFERENCES[kind]})
