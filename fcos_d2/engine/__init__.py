"""Training and launch machinery that detectron2's engine does not provide."""
from .amp import CPUAMPTrainer
from .heartbeat import STALLED_EXIT_CODE, ReportProgress
from .hooks import StopOnNonFiniteLoss, WarnOnLowDiskSpace
from .launch import WorkerLostError, launch
from .preemption import PREEMPTED_EXIT_CODE, SaveOnPreemption
from .resumable_loader import ResumableTrainLoader, build_resumable_train_loader
from .resume import ExactResume

__all__ = ["CPUAMPTrainer", "ExactResume", "PREEMPTED_EXIT_CODE", "ReportProgress",
           "ResumableTrainLoader", "STALLED_EXIT_CODE", "SaveOnPreemption",
           "StopOnNonFiniteLoss", "WarnOnLowDiskSpace", "WorkerLostError",
           "build_resumable_train_loader", "launch"]
