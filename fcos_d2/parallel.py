"""The model inside DistributedDataParallel."""
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def unwrap_ddp(model: nn.Module) -> nn.Module:
    """The module DistributedDataParallel wraps, or `model` itself."""
    return model.module if isinstance(model, DistributedDataParallel) else model
