"""What the family's contenders cost at inference: parameters, GFLOPs and CPU latency per
image (``python -m benchmarks.train_quality --family-costs RUNS``), each contender built as
the training-quality protocol builds it (random weights: cost does not depend on them) and
timed on the same validation image, the models in turn each round so that other load hits
all alike. One record per contender in benchmarks/results/family_costs.jsonl."""
import statistics
import time
from typing import Dict, List

from benchmarks import records
from benchmarks.train_quality import protocol
from benchmarks.train_quality.catalog import build_contender, contender_cfg

COSTS_BENCHMARK = "family_costs"  # benchmarks/results/family_costs.jsonl


def first_val_image(cfg) -> List[Dict]:
    """The protocol's first validation image as a detectron2 input batch of one."""
    from detectron2.data import build_detection_test_loader

    return next(iter(build_detection_test_loader(cfg, cfg.DATASETS.TEST[0])))


def image_to_boxes(model, inputs: List[Dict]):
    """`model` as a module of one image tensor returning its boxes and scores (tensors,
    which fvcore's tracing needs), in eval mode."""
    import torch

    class ImageToBoxes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, image):
            output = self.model([{**inputs[0], "image": image}])[0]["instances"]
            return output.pred_boxes.tensor, output.scores

    return ImageToBoxes().eval()


def gflops(model, inputs: List[Dict]) -> float:
    """fvcore's count of the whole inference (one multiply-add is one flop, as detectron2
    reports; operators fvcore does not know, as torchvision's deform_conv2d, count 0)."""
    import torch
    from fvcore.nn import FlopCountAnalysis

    with torch.no_grad():
        analysis = FlopCountAnalysis(image_to_boxes(model, inputs),
                                     (inputs[0]["image"],))
        analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        analysis.tracer_warnings("none")
        return analysis.total() / 1e9


def timed_inference(models: Dict[str, object], inputs: List[Dict], runs: int) -> Dict[str, float]:
    """Median milliseconds of one inference of each model on `inputs` over `runs` rounds
    (each round runs every model once, after two warm-up rounds)."""
    import torch

    times = {name: [] for name in models}
    with torch.no_grad():
        for round_ in range(runs + 2):
            for name, model in models.items():
                start = time.perf_counter()
                model(inputs)
                if round_ >= 2:
                    times[name].append(1000 * (time.perf_counter() - start))
    return {name: statistics.median(t) for name, t in times.items()}


def _register_once(cfg) -> None:
    """Registers the protocol's datasets unless `cfg`'s test set already is."""
    from detectron2.data import DatasetCatalog

    if cfg.DATASETS.TEST[0] not in DatasetCatalog.list():
        protocol.register_datasets()


def contender_gflops(name: str) -> float:
    """`name`'s GFLOPs as ``measure`` counts them (random weights, the first validation
    image): a count, which no load on the machine changes."""
    import torch

    cfg = contender_cfg(name, 0, "unused")
    _register_once(cfg)
    torch.manual_seed(0)
    return gflops(build_contender(name, cfg).eval(), first_val_image(cfg))


def measure(names: List[str], runs: int, threads: int) -> Dict[str, Dict[str, float]]:
    """{contender: {"params_M", "gflops", "latency_ms"}} for `names`, on `threads` threads."""
    import torch

    torch.set_num_threads(threads)
    models, inputs, costs = {}, None, {}
    for name in names:
        cfg = contender_cfg(name, 0, "unused")
        _register_once(cfg)
        torch.manual_seed(0)
        models[name] = build_contender(name, cfg).eval()
        inputs = inputs or first_val_image(cfg)
        costs[name] = {"params_M": sum(p.numel() for p in models[name].parameters()) / 1e6,
                       "gflops": gflops(models[name], inputs)}
    for name, ms in timed_inference(models, inputs, runs).items():
        costs[name]["latency_ms"] = ms
    return costs


def cost_records(costs: Dict[str, Dict[str, float]], runs: int, threads: int,
                 command: str) -> List[dict]:
    """One ``benchmarks.records`` record per contender of `costs`."""
    return [records.make_record(COSTS_BENCHMARK, command=command, seed=None, overrides=[],
                                metrics=metrics, times={},
                                run={"contender": name, "runs": runs, "threads": threads})
            for name, metrics in costs.items()]


def costs_table(costs: Dict[str, Dict[str, float]]) -> str:
    """A markdown table of `costs`, as the command prints it."""
    rows = ["| contender | params (M) | GFLOPs | CPU latency (ms/image) |", "|---|---|---|---|"]
    rows += [f"| {name} | {c['params_M']:.2f} | {c['gflops']:.3f} | {c['latency_ms']:.1f} |"
             for name, c in costs.items()]
    return "\n".join(rows)
