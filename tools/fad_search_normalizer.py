"""What the EMA loss normalizer does to a FAD search's logged loss.

With ``MODEL.FCOS.LOSS_NORMALIZER "ema"`` (the recipe's), each forward divides the losses by
a moving average of the positives that starts at ``LOSS_NORMALIZER_EMA_INIT`` (300). A
first-order search makes two forwards an iteration (the architecture batch, then the
training batch) through one normalizer. The positives depend on the data and the target
assignment only, so this replays both batch streams of the search config without a model
and prints, per logged window of the search's log (``iteration N/M: mean loss X ...``),
the normalizer, the training batches' positives and the loss per positive: X times the
normalizer over the positives, what a per-batch normalizer would have logged.

    python tools/fad_search_normalizer.py --config-file configs/FAD/FAD-search-P2-P4.yaml \
        --log output/fad_search_p2p4/log.txt OUTPUT_DIR output/normalizer_replay

The config's setup writes its usual files to OUTPUT_DIR: give it a folder of its own.
"""
import argparse
import re
import statistics
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import torch

import fcos_d2  # noqa: F401  (before detectron2: its compatibility shims)
from fcos_d2.modeling.assignment import assign_targets, compute_locations, level_size_ranges
from fcos_d2.modeling.fad import search as fad_search
from fcos_d2.modeling.losses import EMANormalizer

LOGGED = re.compile(r"iteration (\d+)/\d+: mean loss ([0-9.]+) over the last (\d+) iterations")


def logged_losses(text: str) -> List[Tuple[int, int, float]]:
    """(last iteration, iterations averaged, mean loss) of each loss line of a search log."""
    return [(int(m.group(1)), int(m.group(3)), float(m.group(2))) for m in LOGGED.finditer(text)]


def normalizer_values(positives: Sequence[Tuple[int, int]], initial: float,
                      momentum: float) -> List[float]:
    """The normalizer after each iteration's training forward, for (architecture batch,
    training batch) positives per iteration, updated in that order."""
    ema, values = EMANormalizer(initial, momentum), []
    for arch, train in positives:
        ema(float(arch), 1.0)
        values.append(ema(float(train), 1.0)[0])
    return values


def per_positive(windows: Sequence[Tuple[int, int, float]], train_positives: Sequence[int],
                 normalizer: Sequence[float]) -> List[Dict[str, float]]:
    """Each logged window's mean normalizer and training positives, and its mean loss
    times their ratio."""
    rows = []
    for last, count, loss in windows:
        ema = statistics.fmean(normalizer[last - count:last])
        pos = statistics.fmean(train_positives[last - count:last])
        rows.append({"iterations": f"{last - count + 1}-{last}", "logged": loss,
                     "normalizer": ema, "positives": pos, "per_positive": loss * ema / pos})
    return rows


def batch_positives(batch: List[dict], cfg, divisor: int) -> int:
    """Positive locations of a mapped batch under the config's FCOS assignment, its images
    padded to a multiple of `divisor` as the model pads them."""
    fcos = cfg.MODEL.FCOS
    strides = [2 ** int(name[1:]) for name in fcos.IN_FEATURES]  # "p3" -> 8
    height = max(d["image"].shape[-2] for d in batch)
    width = max(d["image"].shape[-1] for d in batch)
    shapes = [(-(-height // divisor) * divisor // s, -(-width // divisor) * divisor // s)
              for s in strides]  # the padded batch's levels, (Hi, Wi)
    locations = compute_locations(shapes, strides, torch.device("cpu"))
    total = 0
    for d in batch:
        labels, _ = assign_targets(
            locations, [d["instances"].gt_boxes.tensor], [d["instances"].gt_classes],
            strides=strides, size_ranges=level_size_ranges(fcos.SIZES_OF_INTEREST),
            center_sampling_radius=fcos.CENTER_SAMPLING_RADIUS, num_classes=fcos.NUM_CLASSES,
            norm_reg_targets=True)
        total += int((labels != fcos.NUM_CLASSES).sum())
    return total


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-file", required=True)
    parser.add_argument("--log", required=True, type=Path, help="the search's log.txt")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides")
    args = parser.parse_args(argv)
    cfg = fad_search.setup(fad_search.default_argument_parser().parse_args(
        ["--config-file", args.config_file, *args.opts]))
    if cfg.MODEL.FAD.SEARCH.SECOND_ORDER or cfg.MODEL.FCOS.LOSS_NORMALIZER != "ema":
        raise SystemExit(f"{args.config_file}: replays a first-order search with "
                         f"MODEL.FCOS.LOSS_NORMALIZER 'ema' only")
    windows = logged_losses(args.log.read_text())
    if not windows:
        raise SystemExit(f"{args.log}: no 'iteration N/M: mean loss X over the last K "
                         f"iterations' line")
    search = fad_search.Search(cfg)
    divisor = max(search.model.backbone.size_divisibility, 1)
    positives = [(batch_positives(search.arch_stream.batch(i), cfg, divisor),
                  batch_positives(search.train_stream.batch(i), cfg, divisor))
                 for i in range(max(last for last, _, _ in windows))]
    fcos = cfg.MODEL.FCOS
    normalizer = normalizer_values(positives, fcos.LOSS_NORMALIZER_EMA_INIT,
                                   fcos.LOSS_NORMALIZER_EMA_MOMENTUM)
    print("| iterations | logged mean loss | normalizer | training positives | loss per "
          "positive |\n| --- | --- | --- | --- | --- |")
    for row in per_positive(windows, [train for _, train in positives], normalizer):
        print(f"| {row['iterations']} | {row['logged']:.2f} | {row['normalizer']:.1f} | "
              f"{row['positives']:.1f} | {row['per_positive']:.2f} |")


if __name__ == "__main__":
    main()
