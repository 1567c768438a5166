"""``python -m benchmarks.train_quality.offsets``: how far a trained contender's deformable
convs sample from their regular grid (issue 62's DCN diagnosis).

For every ``DeformConv2d`` of the contender, over the first validation batches: the feature
map it reads (H x W), the mean and the largest |offset| in feature pixels, the fraction of
its samples that land outside the map (read as zeros) and the mean modulation mask. A
conv whose offsets are as long as its map is wide samples mostly padding. Each run appends
a record to ``benchmarks/results/dcn_offsets.jsonl``.

    python -m benchmarks.train_quality.offsets --contender 'nas-fcos fpn dcn' \\
        --weights 'output/train_quality_designed/runs/nas-fcos fpn dcn-0/model_final.pth'
"""
import argparse
import shlex
import sys
from typing import Dict, Iterable, List, Optional

import torch
from torch import Tensor, nn

from benchmarks import records
from fcos_d2.modeling.deform_sampling import tap_positions
from fcos_d2.modeling.layers import DeformConv2d

BENCHMARK = "dcn_offsets"  # benchmarks/results/dcn_offsets.jsonl


def offset_statistics(conv: DeformConv2d, x: Tensor) -> Dict[str, float]:
    """The offsets ``conv`` predicts for its input ``x`` (N, C, H, W): the map's size, the
    mean and largest |offset| (feature pixels), the fraction of samples outside the map,
    the mean mask (1.0 for DCNv1)."""
    with torch.no_grad():
        offset, mask = conv.predict_offsets(x)  # (N, G * K * 2, Ho, Wo), (N, G * K, ...)
    n, channels, ho, wo = offset.shape
    k = conv.weight.shape[-2] * conv.weight.shape[-1]
    offset = offset.float().view(n, channels // (2 * k), k, 2, ho, wo)  # (N, G, K, 2, ...)
    mask = torch.ones(1) if mask is None else mask.float()
    base_y, base_x = tap_positions(conv.weight.shape[-2:], (ho, wo), conv.stride,
                                    conv.padding, conv.dilation, x.device)
    y = base_y + offset[:, :, :, 0]  # (N, G, K, Ho, Wo) sampling rows
    px = base_x + offset[:, :, :, 1]
    h, w = x.shape[-2:]
    # a bilinear sample is all padding once it is a pixel or more past the border
    outside = (y <= -1) | (y >= h) | (px <= -1) | (px >= w)
    return {"height": h, "width": w, "mean_abs_offset": offset.abs().mean().item(),
            "max_abs_offset": offset.abs().max().item(),
            "outside": outside.float().mean().item(), "mask": mask.mean().item()}


def collect(model: nn.Module, batches: Iterable) -> Dict[str, List[Dict[str, float]]]:
    """``offset_statistics`` of every ``DeformConv2d`` in ``model`` on each of ``batches``
    (run through ``model`` in eval mode), by module name and map size ("name @ HxW": a
    head's convs run once a level)."""
    stats: Dict[str, List[Dict[str, float]]] = {}
    hooks = []

    def record(name: str, conv: DeformConv2d, x: Tensor) -> None:
        found = offset_statistics(conv, x)
        key = f"{name} @ {found['height']}x{found['width']}"
        stats.setdefault(key, []).append(found)

    for name, module in model.named_modules():
        if isinstance(module, DeformConv2d):
            hooks.append(module.register_forward_hook(
                lambda m, inputs, _, name=name: record(name, m, inputs[0])))
    model.eval()
    try:
        with torch.no_grad():
            for batch in batches:
                model(batch)
    finally:
        for hook in hooks:
            hook.remove()
    return stats


def summarise(stats: Dict[str, List[Dict[str, float]]]) -> Dict[str, Dict]:
    """Each conv's statistics over the batches: its map, the means of its mean |offset|,
    outside fraction and mask, and the largest |offset| seen."""
    convs = {}
    for name, rows in stats.items():
        mean = {key: sum(r[key] for r in rows) / len(rows)
                for key in ("mean_abs_offset", "outside", "mask")}
        convs[name] = {"map": [rows[0]["height"], rows[0]["width"]], **mean,
                       "max_abs_offset": max(r["max_abs_offset"] for r in rows)}
    return convs


def table(stats: Dict[str, List[Dict[str, float]]]) -> str:
    """One markdown row per conv (``summarise``): its map, mean |offset|, largest |offset|,
    fraction outside and mask."""
    lines = ["| deformable conv | map | mean abs offset (px) | largest (px) | outside | mask |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, conv in summarise(stats).items():
        lines.append(f"| `{name}` | {conv['map'][0]}x{conv['map'][1]} | "
                     f"{conv['mean_abs_offset']:.2f} | {conv['max_abs_offset']:.1f} | "
                     f"{conv['outside']:.0%} | {conv['mask']:.2f} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contender", required=True, help="a train_quality contender name")
    parser.add_argument("--weights", required=True, help="its trained model_final.pth")
    parser.add_argument("--batches", type=int, default=4, help="validation batches to read")
    parser.add_argument("opts", nargs=argparse.REMAINDER,
                        help="the config overrides the weights were trained with (recorded)")
    args = parser.parse_args(argv)
    from itertools import islice

    from detectron2.checkpoint import DetectionCheckpointer
    from detectron2.data import build_detection_test_loader

    from benchmarks.train_quality import catalog, protocol

    protocol.register_datasets("shapes")
    cfg = catalog.contender_cfg(args.contender, 0, "output/offsets", args.opts)
    model = catalog.build_contender(args.contender, cfg)
    DetectionCheckpointer(model).load(args.weights)
    loader = build_detection_test_loader(cfg, cfg.DATASETS.TEST[0])
    stats = collect(model, islice(loader, args.batches))
    if not stats:
        raise SystemExit(f"contender {args.contender!r} has no deformable conv")
    print(table(stats))
    command = "python -m benchmarks.train_quality.offsets " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    path = records.append_record(offsets_record(stats, args, command))
    print(f"record appended to {path}")


def offsets_record(stats: Dict[str, List[Dict[str, float]]], args, command: str) -> dict:
    """The record of one measurement: every conv's ``summarise``d statistics."""
    return records.make_record(
        BENCHMARK, command=command, seed=None, overrides=list(args.opts),
        metrics={"convs": summarise(stats)}, times={},
        run={"contender": args.contender, "weights": str(args.weights),
             "batches": args.batches})


if __name__ == "__main__":
    main()
