"""The search loop: the FPN first (with the config's head), then the head on the best FPN;
one PPO step per sampled genotype; the state is saved after every sample, so that
``--resume`` continues where a run stopped."""
import json
import logging
import os
from pathlib import Path
from typing import Dict, List

import torch

from ..genotypes import HeadGenotype, parse_fpn_genotype, parse_head_genotype
from .controller import (PPO, Controller, fpn_decisions, fpn_from_actions, head_decisions,
                         head_from_actions, sample_uniform, sample_valid)
from .proxy import ProxyTask

logger = logging.getLogger(__name__)
STATE = "search_state.pth"


def _save(state: Dict, folder: Path) -> None:
    tmp = folder / (STATE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, folder / STATE)  # atomic: a killed run leaves the previous state
    (folder / "search_records.json").write_text(json.dumps(state["records"], indent=1))


def _phase(name: str, samples: int, controller: Controller, ppo: PPO, decode, proxy: ProxyTask,
           state: Dict, folder: Path, random_search: bool, reward_of) -> None:
    done = sum(r["phase"] == name for r in state["records"])
    generator = torch.Generator().manual_seed(state["seed"] * 1000 + done)
    for index in range(done, samples):
        if random_search:
            actions, genotype = sample_uniform(controller.limits, decode, generator)
            old_log_prob = 0.0
        else:
            actions, genotype, old_log_prob = sample_valid(controller, decode, generator)
        reward = reward_of(genotype, index)
        if not random_search:
            ppo.update(actions, old_log_prob, reward)
        state["records"].append({"phase": name, "sample": index, "reward": reward,
                                 "genotype": genotype_config(genotype)})
        state[name + "_ppo"] = ppo.state_dict()
        _save(state, folder)
        logger.info("%s sample %d: reward %.4f %s", name, index, reward,
                    genotype_config(genotype))


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
    _phase("fpn", fpn_samples, fpn_ctrl, fpn_ppo, fpn_from_actions, proxy, state, folder,
           random_search, lambda g, i: proxy.reward(g, config_head, seed=i))
    best_fpn = parse_fpn_genotype(best(state["records"], "fpn")["genotype"]["FPN_GENOTYPE"])
    _phase("head", head_samples, head_ctrl, head_ppo, head_from_actions, proxy, state, folder,
           random_search, lambda g, i: proxy.reward(best_fpn, g, seed=i))
    return state["records"]
