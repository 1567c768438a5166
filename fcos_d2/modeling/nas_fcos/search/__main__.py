"""``python -m fcos_d2.modeling.nas_fcos.search``: the NAS-FCOS search (re-implemented
from the paper) on a dataset's first images, on the CPU by default.

    python -m fcos_d2.modeling.nas_fcos.search --output output/nas_fcos/search

prints the top genotypes of each phase with their rewards and writes ``best.yaml``, a
config (based on ``--config-file``) that trains the best FPN and head:

    python train_net.py --config-file output/nas_fcos/search/best.yaml

``python tools/nas_fcos_search.py --num-workers N ...`` (the same flags) runs it on N
data-parallel workers started by ``fcos_d2.engine.launch`` (this module may not import
the engine): each trains its own share of every round's samples (see ``loop``).
"""
import argparse
import logging
from pathlib import Path
from typing import List, Optional

import yaml
import torch
from detectron2.config import get_cfg
from detectron2.utils import comm

from ....config import add_fcos_config, get_config_file
from .loop import best, run_search
from .proxy import ProxyTask, load_inputs


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-file", default=get_config_file("NAS-FCOS/quickstart.yaml"),
                        help="a NASFCOS config; its bottom-up (MODEL.WEIGHTS) stays fixed")
    parser.add_argument("--dataset", default="synthetic_shapes_train")
    parser.add_argument("--first-image", type=int, default=0,
                        help="index of the first image used (e.g. past those the "
                        "--bottom-up-weights model trained on)")
    parser.add_argument("--train-images", type=int, default=16)
    parser.add_argument("--val-images", type=int, default=8, help="held out, after them")
    parser.add_argument("--fpn-samples", type=int, default=16)
    parser.add_argument("--head-samples", type=int, default=8)
    parser.add_argument("--proxy-iterations", type=int, default=10,
                        help="training steps of each sampled decoder")
    parser.add_argument("--bottom-up-weights", default="",
                        help="a trained detector's checkpoint (e.g. the recipe's "
                        "model_final.pth): its backbone.bottom_up.* become the fixed "
                        "bottom-up; default: the config's initialisation")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW lr of the proxy task")
    parser.add_argument("--channels", type=int, default=32,
                        help="width of the proxy decoders (best.yaml keeps the config's)")
    parser.add_argument("--num-cells", type=int, default=7)
    parser.add_argument("--head-layers", type=int, default=6)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--random", action="store_true",
                        help="uniform random search instead of the controller (a baseline)")
    parser.add_argument("--resume", action="store_true", help="continue --output's search")
    parser.add_argument("--output", default="output/nas_fcos/search")
    parser.add_argument("--num-workers", "--num-gpus", type=int, default=1,
                        help="data-parallel workers (tools/nas_fcos_search.py starts them; "
                        "each evaluates its share of the samples, on the CPU)")
    parser.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides KEY VALUE")
    return parser


def write_best_config(records: List[dict], config_file: str, folder: Path) -> Path:
    """``best.yaml``: ``config_file`` with the best FPN and head genotypes."""
    node = {**best(records, "fpn")["genotype"], **best(records, "head")["genotype"]}
    config = {"_BASE_": str(Path(config_file).resolve()), "MODEL": {"NAS_FCOS": node},
              "OUTPUT_DIR": str(folder / "best")}
    path = folder / "best.yaml"
    path.write_text("# The best genotypes of the NAS-FCOS search in this folder.\n"
                    + yaml.safe_dump(config, default_flow_style=None, sort_keys=False))
    return path


def search(args: argparse.Namespace) -> Path:
    """The search of the parsed ``args`` in this worker (one of a process group, or
    alone); the main worker prints the top genotypes and writes ``best.yaml``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.NAS_FCOS.CHANNELS = args.channels
    train = load_inputs(cfg, args.dataset, args.first_image, args.train_images)
    val = load_inputs(cfg, args.dataset, args.first_image + args.train_images, args.val_images)
    # The fixed bottom-up is built from the seed: the same in every worker and on --resume.
    torch.manual_seed(args.seed)
    proxy = ProxyTask(cfg, train, val, iterations=args.proxy_iterations,
                      batch_size=args.batch_size, lr=args.lr,
                      bottom_up_weights=args.bottom_up_weights,
                      offset_lr_factor=cfg.SOLVER.DEFORM_OFFSET_LR_FACTOR)
    folder = Path(args.output)
    records = run_search(proxy, folder, fpn_samples=args.fpn_samples,
                         head_samples=args.head_samples, num_cells=args.num_cells,
                         head_layers=args.head_layers, seed=args.seed,
                         random_search=args.random, resume=args.resume)
    path = folder / "best.yaml"
    if comm.is_main_process():
        _print_top(records, args.top_k)
        path = write_best_config(records, args.config_file, folder)
        print(f"wrote {path}: python train_net.py --config-file {path}")
    comm.synchronize()  # every worker returns once best.yaml is written
    return path


def _print_top(records: List[dict], top_k: int) -> None:
    for phase in ("fpn", "head"):
        ranked = sorted((r for r in records if r["phase"] == phase), key=lambda r: -r["reward"])
        print(f"top {phase} genotypes (reward = -held-out loss):")
        for r in ranked[:top_k]:
            print(f"  {r['reward']:.4f}  sample {r['sample']}: {r['genotype']}")


def main(argv: Optional[List[str]] = None) -> Path:
    """``python -m fcos_d2.modeling.nas_fcos.search``: the search in this process."""
    args = argument_parser().parse_args(argv)
    if args.num_workers > 1:
        raise SystemExit(f"--num-workers {args.num_workers}: python -m "
                         f"fcos_d2.modeling.nas_fcos.search runs one worker; start several "
                         f"with python tools/nas_fcos_search.py (the same flags)")
    return search(args)


if __name__ == "__main__":
    main()
