"""Training and launch machinery that detectron2's engine does not provide."""
from .amp import CPUAMPTrainer
from .launch import launch

__all__ = ["CPUAMPTrainer", "launch"]
