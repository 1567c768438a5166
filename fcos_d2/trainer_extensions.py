"""Trainer extensions: what a member of the family adds to the library trainer
(``fcos_d2.engine.trainer``) without the trainer naming it.

A member (``fcos_d2/modeling/<member>/``) subclasses :class:`TrainerExtension`, overrides
the steps it needs and registers one instance with :func:`register_trainer_extension`
when its package is imported. The trainer asks :func:`trainer_extensions_for` which
extensions apply to its config and calls each one's steps, in registration order:

| step              | when                                                 | default      |
| ----------------- | ---------------------------------------------------- | ------------ |
| ``check_config``  | ``setup`` (before ``adjust_config``), ``build_model``| nothing      |
| ``adjust_config`` | ``setup``, before the config is frozen               | nothing      |
| ``after_load``    | after ``resume_or_load`` of a training               | nothing      |
| ``test_mapper``   | ``build_test_loader``: the mapper of test images     | the default  |
| ``test_model``    | ``test``: the model evaluated, and its summary label | the model    |
| ``hooks``         | ``build_hooks``: hooks appended after the trainer's  | none         |

This module sits below modeling and engine (it imports neither), so that a member
registers its extension from modeling without importing the trainer.
"""
from typing import Any, Dict, List, Tuple

from torch import nn

__all__ = ["TrainerExtension", "register_trainer_extension", "registered_trainer_extensions",
           "trainer_extensions_for", "unregister_trainer_extension"]


class TrainerExtension:
    """What a member adds to the trainer; every step does nothing unless overridden.

    Attributes:
        name: unique name of the extension (registering a name again replaces it).
        meta_architectures: the ``MODEL.META_ARCHITECTURE`` values it applies to (the
            default :meth:`applies`).
    """
    name: str = ""
    meta_architectures: Tuple[str, ...] = ()

    def applies(self, cfg) -> bool:
        """Whether the trainer of ``cfg`` uses this extension (default: its META_ARCH is
        one of ``meta_architectures``)."""
        return cfg.MODEL.META_ARCHITECTURE in self.meta_architectures

    def check_config(self, cfg) -> None:
        """Raises ValueError, naming the key, where ``cfg`` cannot train or evaluate."""

    def adjust_config(self, cfg) -> None:
        """Changes ``cfg`` (not frozen yet) in place, in ``setup``, after the command line."""

    def after_load(self, model: nn.Module, cfg, *, resuming: bool) -> None:
        """After a training loaded MODEL.WEIGHTS (``resuming`` False) or its last
        checkpoint (True) into ``model`` (unwrapped from DDP)."""

    def test_mapper(self, cfg, default: Any) -> Any:
        """The dataset mapper of the test loader; ``default`` is the trainer's (or the one
        an extension registered before returned)."""
        return default

    def test_model(self, cfg, model: nn.Module) -> Tuple[nn.Module, str]:
        """(the model evaluated instead of ``model``, possibly DDP-wrapped; a label for the
        summary.txt block, "" for none)."""
        return model, ""

    def hooks(self, cfg) -> List[Any]:
        """detectron2 hooks the trainer appends after its own."""
        return []


_EXTENSIONS: Dict[str, TrainerExtension] = {}


def register_trainer_extension(extension: TrainerExtension) -> TrainerExtension:
    """Registers ``extension`` (replacing one of the same name) and returns it.

    Raises:
        ValueError: the extension has no ``name``.
    """
    if not extension.name:
        raise ValueError(f"trainer extension {type(extension).__name__}: set its class "
                         "attribute `name` (unique) before registering it")
    _EXTENSIONS[extension.name] = extension
    return extension


def unregister_trainer_extension(name: str) -> None:
    """Removes the extension registered as ``name`` (nothing if there is none)."""
    _EXTENSIONS.pop(name, None)


def registered_trainer_extensions() -> List[TrainerExtension]:
    """The registered extensions, in registration order."""
    return list(_EXTENSIONS.values())


def trainer_extensions_for(cfg) -> List[TrainerExtension]:
    """The registered extensions that apply to ``cfg``, in registration order."""
    return [extension for extension in _EXTENSIONS.values() if extension.applies(cfg)]
