"""The PNG of FAD's architecture weights over a search: one panel per tower and node, one
line per operation (its mixing weight averaged over the node's incoming edges)."""
from pathlib import Path
from typing import List, Union

import numpy as np

from .genotypes import PRIMITIVES


def plot_mixing_weights(history: List[dict], path: Union[str, Path]) -> None:
    """history: records {"iteration": t, "box": [per node (edges, P)], "cls": [...]}."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot as plt

    towers = ("box", "cls")
    num_nodes = max(len(history[0][t]) for t in towers)
    figure, axes = plt.subplots(len(towers), num_nodes, figsize=(4 * num_nodes, 6),
                                squeeze=False, sharey=True)
    iterations = [record["iteration"] for record in history]
    for row, tower in enumerate(towers):
        for node in range(len(history[0][tower])):
            # (T, P): per record, the node's weights averaged over its edges
            mean = np.array([np.mean(record[tower][node], axis=0) for record in history])
            axis = axes[row][node]
            for p, name in enumerate(PRIMITIVES):
                axis.plot(iterations, mean[:, p], label=name, marker="." if len(mean) < 3 else None)
            axis.set_title(f"{tower} tower, node {node}")
            axis.set_xlabel("iteration")
    axes[0][0].set_ylabel("mixing weight (mean over edges)")
    axes[-1][-1].legend(fontsize=6, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
