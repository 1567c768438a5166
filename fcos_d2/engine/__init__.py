"""Training and launch machinery that detectron2's engine does not provide."""
from .hooks import StopOnNonFiniteLoss
from .launch import WorkerLostError, launch
from .resumable_loader import ResumableTrainLoader, build_resumable_train_loader
from .resume import ExactResume

__all__ = ["ExactResume", "ResumableTrainLoader", "StopOnNonFiniteLoss", "WorkerLostError",
           "build_resumable_train_loader", "launch"]
