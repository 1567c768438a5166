"""Precision-recall curves and per-class AP bars, drawn from COCOeval's results.

COCOeval's ``eval["precision"]`` has shape (T, R, K, A, M): T = 10 IoU thresholds
0.50:0.05:0.95, R = 101 recall points 0:0.01:1, K classes, A = 4 area ranges (all, small,
medium, large), M = 3 detection limits (1, 10, 100); -1 marks a class without ground truth.
The curves use area "all" and the largest detection limit, as COCO's AP does.
"""
import os
from typing import Dict, List, Sequence

import numpy as np
from PIL import Image

__all__ = ["pr_curves", "save_pr_plots", "save_ap_bars", "save_png"]

_RECALL = np.linspace(0.0, 1.0, 101)
_AREA_ALL, _MAX_DETS = 0, -1


def pr_curves(precision: np.ndarray) -> Dict[str, np.ndarray]:
    """The curves plotted: "IoU=0.50", "IoU=0.75" and "IoU=0.50:0.95" (mean over the ten
    thresholds), each (K + 1, R): row k the class k, the last row the mean over the classes
    with ground truth. NaN where a class has none.

    Args:
        precision: COCOeval's ``eval["precision"]``, (T, R, K, A, M).
    """
    p = precision[:, :, :, _AREA_ALL, _MAX_DETS].astype(np.float64)  # (T, R, K)
    p[p < 0] = np.nan
    curves = {"IoU=0.50": p[0], "IoU=0.75": p[5], "IoU=0.50:0.95": _nanmean(p, axis=0)}
    return {name: np.concatenate([c.T, _nanmean(c, axis=1)[None]]) for name, c in curves.items()}


def _nanmean(values: np.ndarray, axis: int) -> np.ndarray:
    """Mean over ``axis`` ignoring NaN; NaN where all are NaN (without numpy's warning)."""
    count = np.sum(~np.isnan(values), axis=axis)
    total = np.nansum(values, axis=axis)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def save_pr_plots(precision: np.ndarray, class_names: Sequence[str], folder: str,
                  prefix: str) -> List[str]:
    """One PNG per class and one for all classes (the mean curve): ``<prefix>_all.png``,
    then ``<prefix>_<k>.png`` for class k. Classes without ground truth get no plot.

    Returns:
        The paths written: all classes first, then the classes in order.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    curves = pr_curves(precision)
    figure = Figure(figsize=(3.2, 2.8), dpi=80)
    canvas = FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    lines = {name: axes.plot(_RECALL, np.zeros_like(_RECALL), label=name, animated=True)[0]
             for name in curves}
    axes.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="recall", ylabel="precision")
    axes.legend(handles=list(lines.values()), loc="lower left", fontsize=7)
    axes.set_title(" ", fontsize=9)
    axes.title.set_animated(True)
    figure.subplots_adjust(left=0.2, bottom=0.16, right=0.96, top=0.9)  # tight_layout: slow
    canvas.draw()  # axes, ticks and legend once; each plot then draws its lines and title
    background = canvas.copy_from_bbox(figure.bbox)
    written = []
    rows = [(len(class_names), "all classes", f"{prefix}_all.png")] + \
        [(k, name, f"{prefix}_{k}.png") for k, name in enumerate(class_names)]
    for row, title, file_name in rows:
        if np.all(np.isnan(curves["IoU=0.50"][row])):
            continue
        canvas.restore_region(background)
        for name, line in lines.items():
            line.set_ydata(curves[name][row])
            axes.draw_artist(line)
        ap = np.nanmean(curves["IoU=0.50:0.95"][row]) * 100
        axes.title.set_text(f"{title} (AP {ap:.1f})")
        axes.draw_artist(axes.title)
        written.append(os.path.join(folder, file_name))
        save_png(Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3]), written[-1])
    return written


def save_png(image: Image.Image, path: str) -> None:
    """A PNG with light compression: several times faster to write than the default."""
    image.save(path, compress_level=1)


def save_ap_bars(ap_per_class: Dict[str, float], path: str, title: str) -> str:
    """A horizontal bar per class, its AP (percent; NaN drawn as no bar), worst at the top."""
    from matplotlib.figure import Figure

    names = sorted(ap_per_class, key=lambda n: np.nan_to_num(ap_per_class[n], nan=-1.0))
    values = [ap_per_class[n] for n in names]
    labels = [f"{n} ({v:.1f})" for n, v in zip(names, values)]
    width, height = 4.5, 0.9 + 0.22 * len(names)  # inches, at 80 dpi
    figure = Figure(figsize=(width, height), dpi=80)
    label_width = (max(map(len, labels), default=1) * 5.5 + 12) / (width * 80)  # ~5.5 px a letter
    figure.subplots_adjust(left=min(0.6, label_width), right=0.95, bottom=0.5 / height,
                           top=1 - 0.3 / height)
    axes = figure.add_subplot()
    axes.barh(range(len(names)), np.nan_to_num(values, nan=0.0), color="#4c72b0")
    axes.set_yticks(range(len(names)), labels, fontsize=8)
    axes.set(xlim=(0, 100), xlabel="AP (%)")
    axes.set_title(title, fontsize=9)
    figure.savefig(path, pil_kwargs={"compress_level": 1})
    return path
