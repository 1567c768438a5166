"""Training and launch machinery that detectron2's engine does not provide."""
from .launch import launch

__all__ = ["launch"]
