"""Training diagnostics for ``python -m benchmarks.train_quality --diagnostics``: where
does a run's variance come from?

``TrainingDiagnostics`` is a detectron2 hook that watches a run without changing it: a
forward hook on the detector's head, a wrapper around its label assignment (an instance
attribute over the bound method, which returns what the method returns) and reads of the
gradients and BN buffers after each step. It records, as one JSON-able dict:

- ``losses``: each loss, mean over windows of ``window`` iterations;
- ``grad_norm``: the L2 norm of all gradients, of the backbone's and of the rest (head,
  and for fcos-d2 the FPN lives in the backbone), mean and max per window (after the
  optimizer step, i.e. after any SOLVER.CLIP_GRADIENTS clipping);
- ``grad_norm_before_step``: the total norm read by an optimizer step pre-hook, before
  detectron2's clipping (which runs inside the step), mean and max per window; equal to
  ``grad_norm``'s total when nothing clips (records made before 2026-12-03 lack it);
- ``positives_per_level``: per window, the mean positives per iteration on each level;
- ``regression`` and ``positive_scores``: every ``every`` iterations (and at the last),
  summaries (mean, std, quantiles 5/25/50/75/95 %) of the head's regression outputs per
  level (fcos-d2: distances in strides after the activation; detectron2: its raw deltas)
  and of the class probability of the positives at their class;
- ``bn``: at the end, per backbone stage (stem, res2-res5), the mean and std of the BN
  layers' running_mean and running_var, and the smallest and largest running_var;
- ``weight_growth``: at the end, per stage, how far training grew the convolutions' weight
  norms (``weight_growth``; records made before 2026-12-03 lack it, ``--weight-growth``
  reads it from the stored weights).

``summarise_diagnostics`` tabulates the records, one row per run; ``positives_per_level``
counts, without training, where the assigners put the positives of a dataset;
``weight_growth_table`` tabulates the weight growth of stored runs.

The head and assignment are found for fcos-d2 (``targets``) and detectron2's FCOS
(``label_anchors``); for another detector (torchvision's) the per-level records are None.
Symbols: N images, L levels, Hi x Wi level sizes, R = sum(Hi * Wi), K classes.
"""
import math
import re
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch

import fcos_d2  # noqa: F401  (its compat shims before detectron2)
from detectron2.engine import HookBase
from torch import Tensor, nn

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
STRIDES = (8, 16, 32, 64, 128)  # P3-P7
NOT_LOSSES = {"data_time", "rank_data_time", "lr", "time", "eta_seconds", "num_pos_anchors"}


def summary(values: Tensor) -> Optional[Dict[str, float]]:
    """Mean, std, quantiles and count of a tensor's entries; None if it is empty."""
    values = values.detach().float().flatten()
    if values.numel() == 0:
        return None
    if values.numel() > 1_000_000:  # torch.quantile's input limit is far above our sizes
        values = values[torch.randperm(values.numel())[:1_000_000]]
    stats = {"mean": values.mean(), "std": values.std() if values.numel() > 1 else 0.0,
             **{f"q{int(q * 100)}": torch.quantile(values, q) for q in QUANTILES}}
    return {"n": int(values.numel()), **{k: round(float(v), 5) for k, v in stats.items()}}


def labels_per_level(labels: Tensor, level_sizes: List[int], num_classes: int) -> List[int]:
    """Positives (label < K) of (N, R) `labels` on each level of `level_sizes` (Hi * Wi)."""
    positive = (labels < num_classes).sum(dim=0)  # (R,)
    return [int(part.sum()) for part in positive.split(level_sizes)]


def positive_probabilities(logits: List[Tensor], labels: Tensor, num_classes: int) -> Tensor:
    """The sigmoid probability of every positive at its class: per level (N, K, Hi, Wi)
    logits and (N, R) labels -> (P,)."""
    flat = torch.cat([x.permute(0, 2, 3, 1).reshape(x.shape[0], -1, x.shape[1])  # (N, HiWi, K)
                      for x in logits], dim=1)  # (N, R, K)
    images, points = (labels < num_classes).nonzero(as_tuple=True)
    return flat[images, points, labels[images, points]].float().sigmoid()


def _stage(name: str) -> Optional[str]:
    """The first part of a parameter or module name that is stem or resN, if any."""
    return next((p for p in name.split(".") if re.fullmatch(r"stem|res\d", p)), None)


def weight_growth(weights: Iterable[Tuple[str, Tensor]]) -> Dict[str, float]:
    """Per ResNet stage (stem, res2-res5), the mean over its convolutions of the squared
    weight norm divided by its expectation at initialisation: detectron2's c2_msra_fill
    draws each weight with variance 2 / fan_out, so numel * 2 / fan_out. 1 where training
    left the norm as drawn. Each of these convs feeds a BN, which undoes any scale of its
    weights: SGD's steps, orthogonal to the weights, then only grow the norm, and the
    layer's effective learning rate (lr / norm^2) shrinks as it grows."""
    ratios: Dict[str, List[float]] = {}
    for name, weight in weights:
        stage = _stage(name)
        if stage is None or weight.dim() != 4 or not name.endswith("weight"):
            continue
        fan_out = weight.shape[0] * weight.shape[2] * weight.shape[3]
        squared = float(weight.detach().float().pow(2).sum())
        ratios.setdefault(stage, []).append(squared * fan_out / (2 * weight.numel()))
    return {stage: round(sum(v) / len(v), 4) for stage, v in sorted(ratios.items())}


def rank_correlation(a: List[float], b: List[float]) -> float:
    """Spearman's rank correlation of `a` and `b` (ties get their mean rank)."""
    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        result = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in order[i:j + 1]:
                result[k] = (i + j) / 2
            i = j + 1
        return result

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    covariance = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    spread = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return covariance / spread if spread else float("nan")


def weight_growth_table(runs: List[Tuple[str, int, Path]], results: List[Dict]) -> str:
    """A markdown table, one row per stored run (contender, seed, weights file) with a
    record in `results`: AP, the stem's BN running_var mean at the end (where recorded) and
    the weight growth per stage; then the rank correlations over the rows."""
    rows = ["| contender | seed | AP | stem BN running_var | weight growth per stage |",
            "|---|---|---|---|---|"]
    ap, var, stem = [], [], []
    for name, seed, path in runs:
        record = next((r for r in results if r["contender"] == name and r["seed"] == seed
                       and "AP" in r), None)
        if record is None:
            continue
        state = torch.load(path, map_location="cpu", weights_only=False)
        growth = weight_growth(state.get("model", state).items())
        bn = ((record.get("diagnostics") or {}).get("bn") or {}).get("stem")
        rows.append(f"| {name} | {seed} | {record['AP']:.1f} | "
                    f"{'-' if bn is None else format(bn['running_var_mean'], '.2f')} | "
                    + " ".join(f"{k} {v:.2f}" for k, v in growth.items()) + " |")
        if "stem" in growth:
            ap.append(record["AP"])
            stem.append(growth["stem"])
            var.append(None if bn is None else bn["running_var_mean"])
    pairs = [(v, g) for v, g in zip(var, stem) if v is not None]
    rows.append(f"\nRank correlation over {len(stem)} runs: AP with the stem's growth "
                f"{rank_correlation(ap, stem):+.2f}" + (
                    f"; over the {len(pairs)} with diagnostics, the stem's BN running_var "
                    f"with its growth {rank_correlation(*map(list, zip(*pairs))):+.2f}"
                    if len(pairs) > 1 else ""))
    return "\n".join(rows)


def bn_statistics(backbone: nn.Module) -> Dict[str, Dict[str, float]]:
    """Per stage (the first name part matching stem or resN), the BN layers' running
    statistics: mean/std of running_mean and of running_var, min/max of running_var."""
    stages: Dict[str, Dict[str, List[Tensor]]] = {}
    for name, module in backbone.named_modules():
        if not isinstance(module, nn.modules.batchnorm._BatchNorm) or module.running_var is None:
            continue
        stage = _stage(name) or "other"
        buffers = stages.setdefault(stage, {"mean": [], "var": []})
        buffers["mean"].append(module.running_mean.detach().flatten())
        buffers["var"].append(module.running_var.detach().flatten())
    result = {}
    for stage, buffers in sorted(stages.items()):
        means, variances = torch.cat(buffers["mean"]), torch.cat(buffers["var"])
        result[stage] = {k: round(float(v), 5) for k, v in {
            "running_mean_mean": means.mean(), "running_mean_std": means.std(),
            "running_var_mean": variances.mean(), "running_var_std": variances.std(),
            "running_var_min": variances.min(), "running_var_max": variances.max()}.items()}
    return result


def _backbone(model: nn.Module) -> Optional[nn.Module]:
    if hasattr(model, "backbone"):
        return model.backbone
    inner = getattr(model, "fcos", None)  # the torchvision adapter
    return getattr(inner, "backbone", None)


class TrainingDiagnostics(HookBase):
    """Records the diagnostics of the module docstring for one training run of `model`."""

    def __init__(self, model: nn.Module, *, every: int = 100, window: int = 20):
        self.model, self.every, self.window = model, every, window
        self.num_classes = getattr(model, "num_classes", None)
        self.steps: List[Dict] = []  # per iteration: losses, gradient norms, positives
        self.samples: Dict[str, List] = {"regression": [], "positive_scores": []}
        self._outputs, self._labels = None, None
        self._norm_before_step: Optional[float] = None
        head = getattr(model, "head", None)
        method = next((m for m in ("targets", "label_anchors") if hasattr(model, m)), None)
        self.watching = head is not None and method is not None and self.num_classes is not None
        if self.watching:
            head.register_forward_hook(self._keep_outputs)
            self._wrap(method)

    def _wrap(self, method: str) -> None:
        original = getattr(self.model, method)

        def wrapped(*args, **kwargs):
            result = original(*args, **kwargs)
            labels = result[0]  # fcos-d2: (N, R); detectron2: per image (R,)
            self._labels = torch.stack(labels) if isinstance(labels, (list, tuple)) else labels
            return result

        setattr(self.model, method, wrapped)

    def _keep_outputs(self, module, inputs, outputs) -> None:
        if module.training:
            self._outputs = [[x.detach() for x in level_outputs] for level_outputs in outputs]

    def before_train(self) -> None:
        self.trainer.optimizer.register_step_pre_hook(self._read_norm_before_step)

    def _read_norm_before_step(self, optimizer, args, kwargs) -> None:
        # the first call of a step: detectron2's clipping class calls its base class's
        # step, which runs the hooks again once torch has patched it (after clipping)
        if self._norm_before_step is None:
            self._norm_before_step = self._grad_norms()["grad_norm"]["total"]

    def after_step(self) -> None:
        step = {"losses": {k: float(v) for k, (v, _) in self.trainer.storage.latest().items()
                           if k not in NOT_LOSSES}, **self._grad_norms()}
        if self._norm_before_step is not None:
            step["grad_norm_before_step"] = self._norm_before_step
            self._norm_before_step = None
        if self.watching and self._labels is not None and self._outputs is not None:
            logits, regression = self._outputs[0], self._outputs[1]
            sizes = [x.shape[-2] * x.shape[-1] for x in logits]
            step["positives"] = labels_per_level(self._labels, sizes, self.num_classes)
            it = self.trainer.iter
            if it % self.every == 0 or it == self.trainer.max_iter - 1:
                self._sample(logits, regression)
        self.steps.append(step)
        self._outputs, self._labels = None, None

    def _sample(self, logits: List[Tensor], regression: List[Tensor]) -> None:
        it = self.trainer.iter
        self.samples["regression"].append({"iter": it, "levels": [summary(r) for r in regression]})
        scores = positive_probabilities(logits, self._labels, self.num_classes)
        self.samples["positive_scores"].append({"iter": it, **(summary(scores) or {"n": 0})})

    def _grad_norms(self) -> Dict[str, float]:
        squares = {"backbone": 0.0, "head": 0.0}
        for name, parameter in self.model.named_parameters():
            if parameter.grad is not None:
                part = "backbone" if "backbone" in name.split(".") else "head"
                squares[part] += float(parameter.grad.detach().float().pow(2).sum())
        total = squares["backbone"] + squares["head"]
        return {"grad_norm": {k: v ** 0.5 for k, v in {"total": total, **squares}.items()}}

    def record(self) -> Dict:
        """The run's diagnostics (see the module docstring)."""
        windows = [self.steps[i:i + self.window] for i in range(0, len(self.steps), self.window)]
        mean = lambda xs: round(sum(xs) / len(xs), 5) if xs else None  # noqa: E731
        keys = sorted({k for s in self.steps for k in s["losses"]})
        backbone = _backbone(self.model)
        return {
            "window": self.window, "every": self.every, "iterations": len(self.steps),
            "losses": {k: [mean([s["losses"][k] for s in w if k in s["losses"]])
                           for w in windows] for k in keys},
            "grad_norm": {part: {"mean": [mean([s["grad_norm"][part] for s in w])
                                          for w in windows],
                                 "max": [round(max(s["grad_norm"][part] for s in w), 5)
                                         for w in windows]}
                          for part in ("total", "backbone", "head")},
            "grad_norm_before_step": _mean_and_max(
                [[s["grad_norm_before_step"] for s in w if "grad_norm_before_step" in s]
                 for w in windows], mean),
            "positives_per_level": [[mean(list(level)) for level in
                                     zip(*[s["positives"] for s in w if "positives" in s])]
                                    for w in windows] if self.watching else None,
            "regression": self.samples["regression"] if self.watching else None,
            "positive_scores": self.samples["positive_scores"] if self.watching else None,
            "bn": bn_statistics(backbone) if backbone is not None else None,
            "weight_growth": weight_growth(backbone.named_parameters())
            if backbone is not None else None,
        }


def _mean_and_max(windows: List[List[float]], mean: Callable) -> Optional[Dict[str, List]]:
    """Mean and max per window of per-iteration values; None if no window has any."""
    if not any(windows):
        return None
    return {"mean": [mean(w) for w in windows],
            "max": [round(max(w), 5) if w else None for w in windows]}


def summarise_diagnostics(results: List[Dict], names: List[str]) -> str:
    """A markdown table, one row per run with diagnostics (contenders in the order of
    `names`, then by seed): AP; the last window's classification and box losses; the
    mean and largest total gradient norm (and the largest before clipping, where it was
    recorded and is larger); the share of positives per level over the run;
    the median probability of the positives and the median regression output of each
    level at the last sample; the mean BN running_var per backbone stage at the end."""
    rows = ["| contender | seed | AP | cls / loc loss (end) | grad norm mean / max | "
            "positives per level % | positives' p50 (end) | regression p50 per level (end) | "
            "BN running_var mean per stage |", "|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        runs = sorted((r for r in results if r["contender"] == name and r.get("diagnostics")),
                      key=lambda r: r["seed"])
        for run in runs:
            rows.append(f"| {name} | {run['seed']} | {run['AP']:.1f} | "
                        + " | ".join(_diagnostic_cells(run["diagnostics"])) + " |")
    return "\n".join(rows)


def _diagnostic_cells(d: Dict) -> List[str]:
    def last(*keys):  # fcos-d2 and detectron2 name the losses so, torchvision otherwise
        values = next((d["losses"][k] for k in keys if d["losses"].get(k)), [float("nan")])
        return values[-1]

    norms, before = d["grad_norm"]["total"], d.get("grad_norm_before_step")
    largest = max(norms["max"])
    raw = max((m for m in before["max"] if m is not None), default=0.0) if before else 0.0
    clipped = f" ({raw:.1f} before clipping)" if raw > 1.01 * largest else ""
    cells = [f"{last('loss_fcos_cls', 'classification'):.3f} / "
             f"{last('loss_fcos_loc', 'bbox_regression'):.3f}",
             f"{sum(norms['mean']) / len(norms['mean']):.2f} / {largest:.1f}{clipped}"]
    if d.get("positives_per_level"):
        totals = [sum(level) for level in zip(*d["positives_per_level"])]
        share = [round(100 * t / max(sum(totals), 1e-9)) for t in totals]
        scores = d["positive_scores"][-1].get("q50")
        regression = [level["q50"] if level else None for level in d["regression"][-1]["levels"]]
        cells += ["/".join(map(str, share)), "-" if scores is None else f"{scores:.3f}",
                  "/".join("-" if r is None else f"{r:.2f}" for r in regression)]
    else:
        cells += ["n/a", "n/a", "n/a"]
    bn = d.get("bn") or {}
    cells.append(" ".join(f"{stage} {stats['running_var_mean']:.2f}"
                          for stage, stats in bn.items()) or "n/a")
    return cells


def level_shapes(height: int, width: int, divisibility: int = 32) -> List[tuple]:
    """(Hi, Wi) of P3-P7 for an image padded to `divisibility`: strides 8, 16, 32, then
    P6 and P7 each halve the level above, rounding up (stride-2 3x3 convs)."""
    padded = [math.ceil(v / divisibility) * divisibility for v in (height, width)]
    shapes = [tuple(v // s for v in padded) for s in (8, 16, 32)]
    for _ in range(2):
        shapes.append(tuple(math.ceil(v / 2) for v in shapes[-1]))
    return shapes


def positives_per_level(dataset: List[Dict], assigners: Dict[str, Callable]) -> str:
    """A markdown table: per assigner, the positives over `dataset` (detectron2 dicts,
    boxes XYWH_ABS, images at their own size, no flips), their share per level P3-P7 and
    the objects left without a positive. An assigner maps (locations, boxes (M, 4) XYXY)
    to the matched box index per location (R,), -1 for background; None for a model on
    other levels, which gets a row that says so."""
    from fcos_d2.modeling.assignment import compute_locations

    counts = {name: [0] * 5 for name in assigners}
    orphans = {name: 0 for name in assigners}
    for record in dataset:
        boxes = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in
                              (a["bbox"] for a in record["annotations"])]).reshape(-1, 4)
        if not len(boxes):
            continue
        shapes = level_shapes(record["height"], record["width"])
        locations = compute_locations(shapes, STRIDES, torch.device("cpu"))
        level = torch.arange(5).repeat_interleave(torch.tensor([h * w for h, w in shapes]))
        for name, assign in assigners.items():
            if assign is None:  # other levels than P3-P7: tools/analyze_data.py's table
                continue
            matched = assign(locations, boxes.float())  # (R,)
            for index in range(5):
                counts[name][index] += int(((matched >= 0) & (level == index)).sum())
            orphans[name] += int((torch.bincount(matched[matched >= 0], minlength=len(boxes))
                                  == 0).sum())
    objects = sum(len(r["annotations"]) for r in dataset)
    rows = ["| assigner | positives | % on P3 / P4 / P5 / P6 / P7 | objects without positives |",
            "|---|---|---|---|"]
    for name, levels in counts.items():
        if assigners[name] is None:
            rows.append(f"| {name} | - | not on P3-P7: tools/analyze_data.py prints its levels' "
                        f"table | - |")
            continue
        total = max(sum(levels), 1)
        share = " / ".join(f"{100 * n / total:.1f}" for n in levels)
        rows.append(f"| {name} | {sum(levels)} | {share} | {orphans[name]} of {objects} |")
    return "\n".join(rows)
