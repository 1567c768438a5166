"""The search loop: the FPN first (with the config's head), then the head on the best FPN;
one PPO step per sampled genotype; the state is saved after every round, so that
``--resume`` continues where a run stopped.

Data parallel over W workers (a process group, e.g. from ``fcos_d2.engine.launch``): each
round, every worker draws the same W samples from its copy of the controller with the
same seeded generator, worker r trains sample r of the round (its proxy seeded by the
sample's index, so the reward does not depend on the worker), the rewards are gathered,
the main worker applies the round's PPO steps in sample order and sends the controller
and its optimizer to the others. Every worker holds the same records and controller; only
the main worker writes files. With one worker a round is one sample: draw, reward, PPO
step, as before.
"""
import json
import logging
import os
from pathlib import Path
from typing import Dict, List, Tuple

import torch
from detectron2.utils import comm

from ....progress import Progress
from ..genotypes import HeadGenotype, parse_fpn_genotype, parse_head_genotype
from .controller import (PPO, Controller, fpn_decisions, fpn_from_actions, head_decisions,
                         head_from_actions, sample_uniform, sample_valid)
from .proxy import ProxyTask

logger = logging.getLogger(__name__)
STATE = "search_state.pth"


def save_state(state: Dict, folder: Path) -> None:
    """Writes the search state and ``search_records.json`` to ``folder`` (main worker)."""
    tmp = folder / (STATE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, folder / STATE)  # atomic: a killed run leaves the previous state
    (folder / "search_records.json").write_text(json.dumps(state["records"], indent=1))


def _draw(count: int, controller: Controller, decode, generator: torch.Generator,
          random_search: bool) -> List[Tuple[List[int], object, float]]:
    """``count`` samples (actions, genotype, log-probability at drawing) of one round."""
    drawn = []
    for _ in range(count):
        if random_search:
            drawn.append((*sample_uniform(controller.limits, decode, generator), 0.0))
        else:
            drawn.append(sample_valid(controller, decode, generator))
    return drawn


def _share_controller(ppo: PPO) -> None:
    """Every worker takes the main worker's controller, optimizer and baseline."""
    if comm.get_world_size() > 1:
        state = comm.all_gather(ppo.state_dict() if comm.is_main_process() else None)[0]
        if not comm.is_main_process():
            ppo.load_state_dict(state)


def _phase(name: str, samples: int, controller: Controller, ppo: PPO, decode, proxy: ProxyTask,
           state: Dict, folder: Path, random_search: bool, reward_of,
           progress: Progress) -> None:
    done = sum(r["phase"] == name for r in state["records"])
    generator = torch.Generator().manual_seed(state["seed"] * 1000 + done)
    world, rank = comm.get_world_size(), comm.get_rank()
    while done < samples:
        drawn = _draw(min(world, samples - done), controller, decode, generator, random_search)
        mine = reward_of(drawn[rank][1], done + rank) if rank < len(drawn) else None
        rewards = comm.all_gather(mine)[:len(drawn)] if world > 1 else [mine]
        if not random_search:
            if comm.is_main_process():
                for (actions, _, old_log_prob), reward in zip(drawn, rewards):
                    ppo.update(actions, old_log_prob, reward)
            _share_controller(ppo)
        for index, ((_, genotype, _), reward) in enumerate(zip(drawn, rewards), done):
            state["records"].append({"phase": name, "sample": index, "reward": reward,
                                     "genotype": genotype_config(genotype)})
            if comm.is_main_process():
                logger.info("%s sample %d: reward %.4f %s", name, index, reward,
                            genotype_config(genotype))
        state[name + "_ppo"] = ppo.state_dict()
        if comm.is_main_process():
            save_state(state, folder)
        done += len(drawn)
        progress.update(len(drawn), best=_best_so_far(state["records"], name))


def _best_so_far(records: List[Dict], phase: str) -> str:
    """The best reward of ``phase`` so far, and its sample, for the progress line."""
    record = best(records, phase)
    return f"{record['reward']:.4f} ({phase} sample {record['sample']})"


def genotype_config(genotype) -> Dict:
    """The MODEL.NAS_FCOS keys of a genotype."""
    if isinstance(genotype, HeadGenotype):
        return {"HEAD_GENOTYPE": list(genotype.ops), "HEAD_SHARE_INDEX": genotype.share_index}
    return {"FPN_GENOTYPE": genotype.to_config()}


def best(records: List[Dict], phase: str) -> Dict:
    """The record of ``phase`` with the highest reward."""
    return max((r for r in records if r["phase"] == phase), key=lambda r: r["reward"])


def run_search(proxy: ProxyTask, folder: Path, *, fpn_samples: int, head_samples: int,
               num_cells: int = 7, head_layers: int = 6, seed: int = 0,
               random_search: bool = False, resume: bool = False) -> List[Dict]:
    """Searches and returns the records ({phase, sample, reward, genotype}) of every sample."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    fpn_ctrl = Controller(*fpn_decisions(num_cells))
    head_ctrl = Controller(*head_decisions(head_layers))
    fpn_ppo, head_ppo = PPO(fpn_ctrl), PPO(head_ctrl)
    state = {"seed": seed, "records": []}
    if resume and (folder / STATE).exists():
        state = torch.load(folder / STATE, weights_only=True)
        for key, ppo in (("fpn_ppo", fpn_ppo), ("head_ppo", head_ppo)):
            if key in state:
                ppo.load_state_dict(state[key])
        logger.info("resuming the search after %d samples", len(state["records"]))
    node = proxy.cfg.MODEL.NAS_FCOS
    config_head = parse_head_genotype(node.HEAD_GENOTYPE, node.HEAD_SHARE_INDEX)
    with Progress(fpn_samples + head_samples, "NAS-FCOS search", "samples",
                  initial=min(len(state["records"]), fpn_samples + head_samples),
                  enabled=comm.is_main_process()) as progress:
        _phase("fpn", fpn_samples, fpn_ctrl, fpn_ppo, fpn_from_actions, proxy, state, folder,
               random_search, lambda g, i: proxy.reward(g, config_head, seed=i), progress)
        best_fpn = parse_fpn_genotype(best(state["records"], "fpn")["genotype"]["FPN_GENOTYPE"])
        _phase("head", head_samples, head_ctrl, head_ppo, head_from_actions, proxy, state,
               folder, random_search, lambda g, i: proxy.reward(best_fpn, g, seed=i), progress)
    return state["records"]
