"""Every difference between the detectron2 versions fcos-d2 runs on, in one place.

Supported: detectron2 v0.6 (as installed from the ``pb1-detectron2`` sdist, which has no
C++ extension) and detectron2 built from source at current main. Each difference below has
a comment that says which version needs it and why. This module must be imported before
any ``detectron2`` submodule; ``import fcos_d2`` does that first.
"""
import importlib
import sys
import types

import PIL.Image
import torch
import torch.distributed as dist

# Pillow >= 10 removed ``Image.LINEAR``, an alias of ``Image.BILINEAR`` that detectron2
# v0.6 uses as a default argument in ``detectron2/data/transforms/transform.py``
# (AttributeError at import). Restoring the alias changes no behaviour.
if not hasattr(PIL.Image, "LINEAR"):
    PIL.Image.LINEAR = PIL.Image.BILINEAR


class MissingExtensionError(RuntimeError):
    """An op of detectron2's C++ extension was used, but the extension is not installed."""


_EXTENSION_HELP = (
    "detectron2 was installed without its C++ extension (detectron2._C), so the op "
    "'{op}' is not available. It serves rotated boxes, detectron2's deformable "
    "convolution and the fast C++ COCOeval; FCOS needs none of them. To use it, build "
    "detectron2 from source (see 'GPU users' in fcos-d2's README) in this environment."
)


class _MissingExtension(types.ModuleType):
    """Stands in for ``detectron2._C``: importing works, using any op raises."""

    # collect_env (run by default_setup) asks these to describe the build; answer truly.
    def get_compiler_version(self) -> str:
        return "none: detectron2 installed without its C++ extension"

    def get_cuda_version(self) -> str:
        return "none: detectron2 installed without its C++ extension"

    def has_cuda(self) -> bool:
        return False

    def __getattr__(self, op: str):
        if op.startswith("__"):
            raise AttributeError(op)
        raise MissingExtensionError(_EXTENSION_HELP.format(op=op))


def _install_extension_stand_in() -> bool:
    """Returns whether the real extension exists; installs the stand-in when it does not.

    detectron2 v0.6 imports ``_C`` at module top in ``layers/deform_conv.py``,
    ``layers/roi_align_rotated.py``, ``layers/rotated_boxes.py`` and
    ``evaluation/fast_eval_api.py``, so without an extension ``import detectron2.layers``
    fails. Current main imports it lazily and needs no stand-in.
    """
    try:
        importlib.import_module("detectron2._C")
        return True
    except ImportError:
        stand_in = _MissingExtension("detectron2._C", "stand-in for the missing extension")
        sys.modules["detectron2._C"] = stand_in
        import detectron2

        detectron2._C = stand_in
        _define_missing_nms_rotated()
        return False


def _define_missing_nms_rotated() -> None:
    """v0.6's ``layers/nms.py`` calls ``torch.ops.detectron2.nms_rotated``, an op that only
    the extension registers; define it so that a call says what is missing."""
    library = torch.library.Library("detectron2", "DEF")  # noqa: TOR901 (kept alive below)
    library.define("nms_rotated(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor")

    def missing(boxes, scores, iou_threshold):
        raise MissingExtensionError(_EXTENSION_HELP.format(op="nms_rotated"))

    library.impl("nms_rotated", missing, "CompositeExplicitAutograd")
    _LIBRARIES.append(library)


_LIBRARIES = []  # op libraries must stay referenced, or their ops are unregistered


HAS_D2_EXTENSION: bool = _install_extension_stand_in()


def training_data_iterator(trainer):
    """The data iterator a ``SimpleTrainer`` draws its batches from: v0.6 keeps it in the
    attribute ``_data_loader_iter``, main in a property of that name over a lazily made
    iterator; both give the one the next ``run_step`` takes from."""
    return trainer._data_loader_iter


def create_local_process_group(num_workers_per_machine: int) -> None:
    """Creates the per-machine process group that ``comm.get_local_rank`` reads.

    detectron2 main has ``comm.create_local_process_group``; v0.6 builds the group inline
    in its private ``_distributed_worker`` and stores it in ``comm._LOCAL_PROCESS_GROUP``.
    """
    from detectron2.utils import comm

    if hasattr(comm, "create_local_process_group"):
        comm.create_local_process_group(num_workers_per_machine)
        return
    world_size, rank = dist.get_world_size(), dist.get_rank()
    assert world_size % num_workers_per_machine == 0, (world_size, num_workers_per_machine)
    for machine in range(world_size // num_workers_per_machine):
        ranks = list(range(machine * num_workers_per_machine,
                           (machine + 1) * num_workers_per_machine))
        group = dist.new_group(ranks)  # every rank must take part in every new_group
        if rank in ranks:
            comm._LOCAL_PROCESS_GROUP = group


def _save_the_optimizer_with_default_trainer() -> None:
    """detectron2 v0.6's ``DefaultTrainer.state_dict`` holds the iteration and the hooks'
    states only: the optimizer (momentum buffers, each group's current LR) and AMP's grad
    scaler are not saved, so a resumed run starts without momentum and, for its first
    iteration, with the LR the optimizer was built with. Current main saves them under
    "_trainer" (``SimpleTrainer.state_dict``); v0.6 gets the same methods here."""
    import logging

    from detectron2.engine import DefaultTrainer, TrainerBase

    if DefaultTrainer.state_dict is not TrainerBase.state_dict:
        return  # detectron2 main: DefaultTrainer saves "_trainer" itself

    def state_dict(self):
        state = TrainerBase.state_dict(self)
        state["_trainer"] = self._trainer.state_dict()
        return state

    def load_state_dict(self, state):
        TrainerBase.load_state_dict(self, state)
        if "_trainer" in state:
            self._trainer.load_state_dict(state["_trainer"])
        else:
            logging.getLogger(__name__).warning(
                "The checkpoint has no optimizer state (written by detectron2 v0.6 without "
                "fcos_d2): the optimizer starts again from zero momentum.")

    DefaultTrainer.state_dict, DefaultTrainer.load_state_dict = state_dict, load_state_dict


_save_the_optimizer_with_default_trainer()
