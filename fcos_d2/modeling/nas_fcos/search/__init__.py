"""The NAS-FCOS search, re-implemented from the paper (the authors never released theirs):
a sampler over valid genotypes, an LSTM controller trained with PPO, and a proxy task on
cached bottom-up features. Run it with ``python -m fcos_d2.modeling.nas_fcos.search``."""
from .controller import (PPO, Controller, fpn_decisions, fpn_from_actions, head_decisions,
                         head_from_actions, sample_uniform, sample_valid)
from .loop import run_search
from .proxy import ProxyTask, load_inputs

__all__ = ["PPO", "Controller", "fpn_decisions", "fpn_from_actions", "head_decisions",
           "head_from_actions", "sample_uniform", "sample_valid", "run_search", "ProxyTask",
           "load_inputs"]
