"""Training and launch machinery that detectron2's engine does not provide."""
from .amp import CPUAMPTrainer
from .hooks import StopOnNonFiniteLoss
from .launch import WorkerLostError, launch
from .resumable_loader import ResumableTrainLoader, build_resumable_train_loader
from .resume import ExactResume

__all__ = ["CPUAMPTrainer", "ExactResume", "ResumableTrainLoader", "StopOnNonFiniteLoss",
           "WorkerLostError", "build_resumable_train_loader", "launch"]
