"""FAD's search: ``python -m fcos_d2.modeling.fad.search --config-file configs/FAD/FAD-tiny-search.yaml``.

Trains the supernet (META_ARCHITECTURE "FADSearch") by alternating, every iteration, an
architecture step on a batch of the architecture split and a weight step on a batch of
the training split (``architect.py``); the two splits are disjoint parts of
DATASETS.TRAIN (MODEL.FAD.SEARCH.ARCH_SPLIT, SEED). MODEL.FCOS.NUM_CLASSES is set from the
data. Writes to OUTPUT_DIR: ``genotype.log`` (FAD's two lines, for MODEL.FAD.GENOTYPE_FILE)
and ``genotype.yaml`` every GENOTYPE_PERIOD iterations and at the end, ``alphas.json`` (the
mixing weights over the search) and ``alphas.png`` (their plot) at the end, and
``search_checkpoint.pth`` every SOLVER.CHECKPOINT_PERIOD; ``--resume`` continues from it
exactly (batches, augmentation and initial weights are functions of the seed, the
iteration and the worker).

Data parallel: ``tools/fad_search.py --num-gpus N`` starts N workers through the project's
``fcos_d2.engine.launch`` (NCCL on GPUs, gloo on a CPU; this module may not import the
engine, so the launching entry lives there). Worker r takes images r*b .. r*b + b - 1 of
each batch of both splits (b = SOLVER.IMS_PER_BATCH / N); the gradients of the weights
and of the architecture weights, and after each weight step the floating-point buffers
(BatchNorm statistics), are averaged over the workers, so every worker holds the same
weights, architecture weights and buffers after every step. Only the main worker writes
files. ``python -m fcos_d2.modeling.fad.search`` runs one worker in this process.
"""
import json
import logging
import os
import random
import statistics
import time
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np
import torch
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.engine import default_argument_parser, default_setup
from detectron2.modeling import build_model
from detectron2.solver import build_lr_scheduler
from detectron2.utils import comm
from detectron2.utils.events import EventStorage
from detectron2.utils.logger import setup_logger

from ...checkpoint import FCOSCheckpointer
from ...checkpoint.parts import load_bottom_up
from ...config import add_fcos_config
from ...data import FCOSDatasetMapper, prepare_dataset
from ...progress import Progress
from ..losses import load_loss_normalizer_states, loss_normalizer_states
from .architect import architecture_step, weight_step
from .config import search_options
from .genotypes import PRIMITIVES, write_genotype_file
from .plot import plot_mixing_weights
from .supernet import architecture_parameters, weight_parameters

logger = logging.getLogger("fcos_d2.fad")
CHECKPOINT = "search_checkpoint.pth"


def split_dataset(dicts: Sequence[dict], arch_fraction: float, seed: int):
    """(training split, architecture split): disjoint, a seeded permutation cut at
    ``arch_fraction`` of the images (each split keeps at least one)."""
    order = np.random.default_rng(seed).permutation(len(dicts))
    cut = min(max(1, round(len(dicts) * arch_fraction)), len(dicts) - 1)
    return [dicts[i] for i in sorted(order[cut:])], [dicts[i] for i in sorted(order[:cut])]


class BatchStream:
    """Batches of one split as a pure function of (seed, iteration, worker): epochs are
    seeded permutations; augmentation RNGs are seeded per batch. Resuming needs nothing
    but the iteration."""

    def __init__(self, dicts: Sequence[dict], mapper, batch_size: int, seed: int):
        world, self.rank = comm.get_world_size(), comm.get_rank()
        if batch_size % world:
            raise ValueError(f"SOLVER.IMS_PER_BATCH: {batch_size} is not divisible by the "
                             f"{world} workers")
        self.dicts, self.mapper, self.seed = list(dicts), mapper, seed
        self.batch_size, self.per_worker = batch_size, batch_size // world

    def indices(self, iteration: int) -> List[int]:
        n, start = len(self.dicts), iteration * self.batch_size + self.rank * self.per_worker
        result = []
        for position in range(start, start + self.per_worker):
            permutation = np.random.default_rng([self.seed, position // n]).permutation(n)
            result.append(int(permutation[position % n]))
        return result

    def batch(self, iteration: int) -> List[dict]:
        seed = hash((self.seed, iteration, self.rank)) % 2 ** 31
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        return [self.mapper(dict(self.dicts[i])) for i in self.indices(iteration)]


def setup(args):
    """The search's config: NUM_CLASSES from the data, then detectron2's default_setup."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(args.config_file)
    cfg.merge_from_list(args.opts)
    if cfg.MODEL.META_ARCHITECTURE != "FADSearch":
        raise ValueError(f"MODEL.META_ARCHITECTURE: the search needs 'FADSearch', got "
                         f"'{cfg.MODEL.META_ARCHITECTURE}' (train a genotype with train_net.py)")
    if cfg.MODEL.DEVICE.startswith("cuda") and not torch.cuda.is_available():
        cfg.MODEL.DEVICE = "cpu"
    classes = set()
    for name in cfg.DATASETS.TRAIN:
        prepare_dataset(name)
        DatasetCatalog.get(name)
        classes.add(len(MetadataCatalog.get(name).thing_classes))
    if len(classes) != 1:
        raise ValueError(f"DATASETS.TRAIN: the datasets have different class counts {classes}")
    cfg.MODEL.FCOS.NUM_CLASSES = classes.pop()  # follows the data
    search_options(cfg)  # every key checked before anything runs
    cfg.freeze()
    default_setup(cfg, args)
    setup_logger(cfg.OUTPUT_DIR, distributed_rank=comm.get_rank(), name="fcos_d2")
    return cfg


def average_over_workers(tensors: List[torch.Tensor]) -> None:
    """Replaces each tensor by its mean over the workers, in place (the same result on
    every worker: all-reduce gives each one the same sum)."""
    world = comm.get_world_size()
    if world > 1:
        for t in tensors:
            torch.distributed.all_reduce(t)
            t.div_(world)


def average_buffers(model: torch.nn.Module) -> None:
    """Averages ``model``'s floating-point buffers (BatchNorm's running statistics) over
    the workers: each worker's forwards saw only its own images, and without this the
    workers' buffers, and so their checkpoints and evaluations, would drift apart."""
    average_over_workers([b for b in model.buffers() if b.is_floating_point()])


def load_start_weights(model: torch.nn.Module, cfg, bottom_up_weights: str) -> None:
    """The supernet's starting weights: MODEL.WEIGHTS (e.g. the R-50 search's ImageNet
    backbone; the entries that fit, as train_net.py loads them), then the bottom-up of a
    trained detector (MODEL.FAD.SEARCH.BOTTOM_UP_WEIGHTS, every tensor)."""
    if cfg.MODEL.WEIGHTS:
        FCOSCheckpointer.from_config(cfg, model, reinit_mismatched=True).load(cfg.MODEL.WEIGHTS)
    if bottom_up_weights:
        count = load_bottom_up(model.backbone.bottom_up, bottom_up_weights)
        logger.info(f"FAD search: the bottom-up's {count} tensors from {bottom_up_weights}")


def weight_groups(model: torch.nn.Module, weights: Sequence[torch.Tensor], solver) -> List[dict]:
    """The weights' SGD groups as FAD's (maskrcnn-benchmark's) optimizer makes them: every
    parameter named "...bias" at BASE_LR * BIAS_LR_FACTOR with WEIGHT_DECAY_BIAS (None:
    WEIGHT_DECAY), the others at BASE_LR with WEIGHT_DECAY; empty groups left out."""
    names = {id(p): n for n, p in model.named_parameters()}
    biases = [w for w in weights if "bias" in names[id(w)]]
    others = [w for w in weights if "bias" not in names[id(w)]]
    decay_bias = solver.WEIGHT_DECAY if solver.WEIGHT_DECAY_BIAS is None \
        else solver.WEIGHT_DECAY_BIAS
    groups = [{"params": others, "lr": solver.BASE_LR, "weight_decay": solver.WEIGHT_DECAY},
              {"params": biases, "lr": solver.BASE_LR * solver.BIAS_LR_FACTOR,
               "weight_decay": decay_bias}]
    return [g for g in groups if g["params"]]


class Search:
    """The supernet, its two optimizers, the weights' schedule, the two batch streams and
    the record of the mixing weights; :meth:`run` alternates the steps."""

    def __init__(self, cfg):
        self.cfg, self.options = cfg, search_options(cfg)
        torch.manual_seed(self.options["seed"])  # the same initial weights on every worker
        self.model = build_model(cfg)
        load_start_weights(self.model, cfg, self.options["bottom_up_weights"])
        self.model.train()
        self.alphas = architecture_parameters(self.model)
        self.weights = weight_parameters(self.model)
        solver = cfg.SOLVER
        self.weight_optimizer = torch.optim.SGD(
            weight_groups(self.model, self.weights, solver), lr=solver.BASE_LR,
            momentum=solver.MOMENTUM, weight_decay=solver.WEIGHT_DECAY)
        self.arch_optimizer = torch.optim.Adam(self.alphas, lr=self.options["arch_lr"],
                                               betas=self.options["arch_betas"],
                                               weight_decay=self.options["arch_weight_decay"])
        self.scheduler = build_lr_scheduler(cfg, self.weight_optimizer)
        self.clip_norm = (solver.CLIP_GRADIENTS.CLIP_VALUE if solver.CLIP_GRADIENTS.ENABLED
                          else 0.0)
        dicts = [d for name in cfg.DATASETS.TRAIN for d in DatasetCatalog.get(name)]
        train, arch = split_dataset(dicts, self.options["arch_split"], self.options["seed"])
        mapper = FCOSDatasetMapper(cfg, is_train=True)
        self.train_stream = BatchStream(train, mapper, solver.IMS_PER_BATCH, self.options["seed"])
        self.arch_stream = BatchStream(arch, mapper, solver.IMS_PER_BATCH,
                                       self.options["seed"] + 1)
        self.output = Path(cfg.OUTPUT_DIR)
        self.start_iter, self.history = 0, []
        logger.info(f"FAD search: {len(train)} training and {len(arch)} architecture images "
                    f"(disjoint), {sum(a.numel() for a in self.alphas)} architecture weights")

    def loss(self, batch: List[dict]) -> torch.Tensor:
        return sum(self.model(batch).values())

    def step(self, iteration: int) -> Dict[str, float]:
        """One architecture step, then one weight step; returns the training loss and lr."""
        train_batch, arch_batch = (self.train_stream.batch(iteration),
                                   self.arch_stream.batch(iteration))
        lr = self.weight_optimizer.param_groups[0]["lr"]
        architecture_step(self.model, self.weights, self.alphas, self.arch_optimizer,
                          lambda: self.loss(arch_batch),
                          second_order=self.options["second_order"],
                          train_loss=lambda: self.loss(train_batch),
                          weight_optimizer=self.weight_optimizer, lr=None,
                          reduce=average_over_workers)
        loss = weight_step(self.weights, self.alphas, self.weight_optimizer,
                           lambda: self.loss(train_batch), self.clip_norm,
                           reduce=average_over_workers)
        average_buffers(self.model)
        self.scheduler.step()
        return {"loss": float(loss), "lr": lr}

    def mixing_weights(self) -> Dict[str, List[List[List[float]]]]:
        weights = self.model.head.mixing_weights()
        return {tower: [node.detach().cpu().tolist() for node in nodes]
                for tower, nodes in weights.items()}

    def record(self, iteration: int) -> None:
        """Notes the mixing weights and writes the derived genotypes (main worker)."""
        self.history.append({"iteration": iteration, **self.mixing_weights()})
        if comm.is_main_process():
            box, cls = self.model.genotypes()
            write_genotype_file(self.output / "genotype.log", box, cls)
            write_genotype_file(self.output / "genotype.yaml", box, cls)

    def state_dict(self, next_iteration: int) -> dict:
        return {"model": self.model.state_dict(),
                "weight_optimizer": self.weight_optimizer.state_dict(),
                "arch_optimizer": self.arch_optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "iteration": next_iteration,
                "history": self.history,
                "loss_normalizers": loss_normalizer_states(self.model)}

    def save(self, next_iteration: int) -> None:
        if comm.is_main_process():
            path = self.output / CHECKPOINT
            torch.save(self.state_dict(next_iteration), str(path) + ".tmp")
            os.replace(str(path) + ".tmp", path)  # atomic: never half a checkpoint

    def resume(self) -> bool:
        """Loads OUTPUT_DIR/search_checkpoint.pth if there is one; True when it did."""
        path = self.output / CHECKPOINT
        if not path.is_file():
            return False
        state = torch.load(path, map_location=self.cfg.MODEL.DEVICE, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.weight_optimizer.load_state_dict(state["weight_optimizer"])
        self.arch_optimizer.load_state_dict(state["arch_optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.start_iter, self.history = state["iteration"], state["history"]
        missing, _ = load_loss_normalizer_states(self.model, state.get("loss_normalizers", {}))
        if missing:
            logger.warning(f"FAD search: {path} has no state of the EMA loss normalizer of "
                           f"{missing} (an older search): it starts again")
        logger.info(f"FAD search: resumed from {path} at iteration {self.start_iter}")
        return True

    def run(self) -> Dict[str, float]:
        """Iterations start_iter .. SOLVER.MAX_ITER - 1, then the final genotypes, the
        record, its plot and a summary (times, peak memory) in OUTPUT_DIR."""
        solver, period = self.cfg.SOLVER, self.options["genotype_period"]
        wall, cpu = time.perf_counter(), time.process_time()
        storage = EventStorage(self.start_iter)  # the model may put diagnostics there
        progress = Progress(solver.MAX_ITER, "FAD search", "iterations",
                            initial=self.start_iter, enabled=comm.is_main_process())
        recent: List[float] = []  # the training losses since the last record
        for iteration in range(self.start_iter, solver.MAX_ITER):
            storage.iter = iteration
            with storage:
                metrics = self.step(iteration)
            recent.append(metrics["loss"])
            progress.update(1, loss=f"{metrics['loss']:.4f}",
                            mean_loss=f"{statistics.fmean(recent):.4f}")
            if (iteration + 1) % period == 0 or iteration == solver.MAX_ITER - 1:
                self.record(iteration + 1)
                logger.info(loss_line(iteration + 1, solver.MAX_ITER, recent, metrics["lr"]))
                recent = []
            if (iteration + 1) % solver.CHECKPOINT_PERIOD == 0 or iteration == solver.MAX_ITER - 1:
                self.save(iteration + 1)
        progress.close()
        summary = {"iterations": solver.MAX_ITER - self.start_iter,
                   "wall_seconds": time.perf_counter() - wall,
                   "cpu_seconds": time.process_time() - cpu,
                   "repshare": self.options["repshare"],
                   "second_order": self.options["second_order"]}
        if comm.is_main_process():
            if not self.history or self.history[-1]["iteration"] != solver.MAX_ITER:
                self.record(solver.MAX_ITER)
            (self.output / "alphas.json").write_text(json.dumps(
                {"primitives": PRIMITIVES, "history": self.history}))
            plot_mixing_weights(self.history, self.output / "alphas.png")
            (self.output / "search_summary.json").write_text(json.dumps(summary, indent=1))
        comm.synchronize()  # every worker returns once the files are written
        return summary


def loss_line(iteration: int, max_iter: int, losses: List[float], lr: float) -> str:
    """The log line of a record: this worker's mean training loss since the previous record
    (one batch's loss alone swings several-fold), and its last batch's."""
    return (f"iteration {iteration}/{max_iter}: mean loss {statistics.fmean(losses):.4f} "
            f"over the last {len(losses)} iterations (the last batch {losses[-1]:.4f}), "
            f"lr {lr:.5f}")


def main(args) -> Dict[str, float]:
    cfg = setup(args)
    search = Search(cfg)
    if args.resume:
        search.resume()
    return search.run()


def run_from_command_line(argv=None) -> None:
    """``python -m fcos_d2.modeling.fad.search``: the search in this process (one worker)."""
    args = default_argument_parser().parse_args(argv)
    if args.num_gpus * args.num_machines > 1:
        raise SystemExit(f"--num-gpus {args.num_gpus} --num-machines {args.num_machines}: "
                         f"python -m fcos_d2.modeling.fad.search runs one worker; start "
                         f"several with python tools/fad_search.py (the same flags)")
    main(args)


if __name__ == "__main__":
    run_from_command_line()
