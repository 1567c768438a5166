"""``FCOSCheckpointer``: detectron2's DetectionCheckpointer, made safe against faults.

- Saving is atomic: a checkpoint is written to a temporary file in OUTPUT_DIR, fsynced
  and renamed; ``last_checkpoint`` is rewritten the same way, only after. A run killed
  while saving leaves the previous checkpoint and ``last_checkpoint`` as they were. A
  write that fails (a full disk) removes the temporary file and raises
  ``CheckpointWriteError``, naming the file, the free space, the size needed and the last
  complete checkpoint (``disk_space``).
- Resuming from a ``last_checkpoint`` whose file is missing, truncated or damaged falls
  back to the newest readable checkpoint in OUTPUT_DIR, with a warning naming both files;
  with none readable it stops, naming the damaged file.
- Files are read as data only (``safe_load``); a pickle that needs more than data loads
  only with ``allow_pickle``.
- URL weights are downloaded into a cache and checked by sha256 (``download``);
  ``fcos-d2://NAME`` names a model of ``fcos_d2.model_zoo``.
- Official FCOS and AdelaiDet checkpoints load as they are: recognised by their keys and
  converted in memory, strictly, with a log line (``layouts``).
- Weights of a model with other FPN levels: per-level tensors are matched by level name
  (``levels``); checkpoints record their levels for that.
- Weights that do not fit the model: when the weights are loaded to evaluate or to resume
  (``reinit_mismatched=False``), a tensor of another shape or a tensor of the model
  missing from the file is an error listing every one (unexpected extra tensors are only
  logged). When they start a training (``reinit_mismatched=True``, train_net.py's
  Trainer without ``--resume``), each layer with a tensor of another shape keeps its fresh
  initialisation, with a warning naming the layers; missing tensors are logged, as
  detectron2 does (ImageNet weights have no FPN or head).
"""
import os
from typing import Any, Dict, List, Optional, Tuple

import torch
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import CfgNode

from .atomic import atomic_write
from .disk_space import CheckpointWriteError, describe_failed_save, os_error_in, tensor_bytes
from .download import check_sha256, checked_weights_sha256, download_weights, is_url
from .layouts import convert_foreign_checkpoint
from .levels import LEVELS_KEY, LevelsMismatchError, fit_levels, model_levels
from .safe_load import (CheckpointReadError, detectron_pickle_to_checkpoint, load_pickle_file,
                        load_torch_file, pycls_to_checkpoint, stored_iteration)

Shape = Tuple[int, ...]


class WeightsMismatchError(ValueError):
    """Weights whose tensors do not fit the model built from the config."""


class _Mismatch(Exception):
    """Raised by _load_model, which does not know the file: (shapes, missing)."""


def _describe_mismatch(path: str, shapes: List[Tuple[str, Shape, Shape]],
                       missing: List[str]) -> str:
    lines = [f"weights {path} do not fit the model built from the config (another "
             f"MODEL.FCOS.NUM_CLASSES, head or backbone width, or another model?):"]
    if shapes:
        lines.append(f"  {len(shapes)} tensors have another shape (file -> model):")
        lines += [f"    {key}: {tuple(theirs)} -> {tuple(ours)}" for key, theirs, ours in shapes]
    if missing:
        lines.append(f"  {len(missing)} tensors of the model are not in the file:")
        lines += [f"    {key}" for key in missing]
    lines.append("  Use the config the weights were trained with, or other weights.")
    return "\n".join(lines)


class FCOSCheckpointer(DetectionCheckpointer):
    """DetectionCheckpointer with atomic saves, resume fallback, data-only loading, URL
    downloads and strict shape checks (see the module docstring).

    Args:
        model, save_dir, save_to_disk, checkpointables: as DetectionCheckpointer.
        allow_pickle: load files that need plain pickle (after a warning); they can run code.
        reinit_mismatched: loading weights that are not a resume (``resume_or_load`` with
            nothing to resume) keeps the fresh initialisation of layers whose shapes
            differ, instead of raising WeightsMismatchError.
        sha256: expected sha256 (or its first >= 6 hex digits) of given files or URLs.
        cache_dir: where URLs are downloaded; default ``download.weights_cache_dir()``.
    """

    def __init__(self, model: torch.nn.Module, save_dir: str = "", *,
                 save_to_disk: Optional[bool] = None, allow_pickle: bool = False,
                 reinit_mismatched: bool = False, sha256: Optional[Dict[str, str]] = None,
                 cache_dir: Optional[str] = None, **checkpointables: Any):
        super().__init__(model, save_dir, save_to_disk=save_to_disk, **checkpointables)
        self.allow_pickle = allow_pickle
        self.reinit_mismatched = reinit_mismatched
        self.sha256 = dict(sha256 or {})
        self.cache_dir = cache_dir
        self._fine_tuning = False  # True while resume_or_load loads weights to start from
        self._read_ahead: Dict[str, Any] = {}  # file -> content read while looking for one
        self._sources: Dict[str, str] = {}  # local copy -> the URL it was downloaded from

    @classmethod
    def from_config(cls, cfg: CfgNode, model: torch.nn.Module, save_dir: str = "", *,
                    reinit_mismatched: bool = False, **checkpointables: Any):
        """Reads MODEL.WEIGHTS_ALLOW_PICKLE and MODEL.WEIGHTS_SHA256 (see config.py)."""
        sha256 = checked_weights_sha256(cfg.MODEL.WEIGHTS_SHA256)
        return cls(model, save_dir, allow_pickle=cfg.MODEL.WEIGHTS_ALLOW_PICKLE,
                   reinit_mismatched=reinit_mismatched,
                   sha256={cfg.MODEL.WEIGHTS: sha256} if sha256 else None, **checkpointables)

    # -- saving -----------------------------------------------------------------------
    def save(self, name: str, **kwargs: Any) -> None:
        """As Checkpointer.save, but atomic (see the module docstring)."""
        if not self.save_dir or not self.save_to_disk:
            return
        data = {"model": self.model.state_dict()}
        levels = model_levels(self.model)
        if levels:  # which level each per-level tensor belongs to (fcos_d2.checkpoint.levels)
            data[LEVELS_KEY] = levels
        data.update({key: obj.state_dict() for key, obj in self.checkpointables.items()})
        data.update(kwargs)
        basename = f"{name}.pth"
        path = os.path.join(self.save_dir, basename)
        self.logger.info(f"Saving checkpoint to {path}")
        last = self.get_checkpoint_file() if self.has_checkpoint() else None
        try:
            atomic_write(path, lambda f: torch.save(data, f))
        except (OSError, RuntimeError) as error:  # torch.save: a RuntimeError after OSError
            if os_error_in(error) is None:
                raise
            raise CheckpointWriteError(describe_failed_save(
                path, tensor_bytes(data), os_error_in(error), last)) from None
        try:
            self.tag_last_checkpoint(basename)
        except OSError as error:
            raise CheckpointWriteError(describe_failed_save(
                os.path.join(self.save_dir, "last_checkpoint"), len(basename), error,
                last)) from None

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        atomic_write(os.path.join(self.save_dir, "last_checkpoint"),
                     lambda f: f.write(last_filename_basename.encode()))

    # -- loading ----------------------------------------------------------------------
    def load(self, path: str, checkpointables: Optional[List[str]] = None) -> Dict[str, Any]:
        """As DetectionCheckpointer.load; URLs are downloaded first (see the module
        docstring), and a given sha256 is checked."""
        if path and is_url(path):
            url, path = path, download_weights(path, sha256=self.sha256.get(path, ""),
                                               cache_dir=self.cache_dir)
            self._sources[path] = url
        elif path and path in self.sha256:
            check_sha256(path, self.sha256[path], source=path)
        if path and "://" not in path and not os.path.isfile(path):
            raise FileNotFoundError(f"checkpoint {path} not found")
        try:
            return super().load(path, checkpointables)
        except _Mismatch as mismatch:
            raise WeightsMismatchError(_describe_mismatch(path, *mismatch.args)) from None
        except LevelsMismatchError as error:
            raise WeightsMismatchError(f"weights {path}: {error}") from None

    def resume_or_load(self, path: str, *, resume: bool = True) -> Dict[str, Any]:
        """As Checkpointer.resume_or_load, with the fallback of the module docstring, and
        ``reinit_mismatched`` applied to ``path`` (weights to start from)."""
        if resume and self.has_checkpoint():
            return self.load(self._readable_last_checkpoint())
        self._fine_tuning = self.reinit_mismatched
        try:
            return self.load(path, checkpointables=[])
        finally:
            self._fine_tuning = False

    def _readable_last_checkpoint(self) -> str:
        """The file ``last_checkpoint`` names if it reads, else the newest one that reads."""
        named = self.get_checkpoint_file()
        try:
            self._read_ahead = {named: self._load_file(named)}
            return named
        except CheckpointReadError as error:
            damage = str(error)
        for candidate in self._newest_first(exclude=named):
            try:
                self._read_ahead = {candidate: self._load_file(candidate)}
            except CheckpointReadError as error:
                self.logger.warning(f"Not resuming from {candidate} either: {error}")
                continue
            self.logger.warning(f"last_checkpoint names {named}, which is damaged ({damage}). "
                                f"Resuming from the newest readable checkpoint, {candidate}.")
            return candidate
        raise CheckpointReadError(
            f"cannot resume: last_checkpoint in {self.save_dir} names {named}, which is "
            f"damaged ({damage}), and no other checkpoint there reads. Remove "
            f"last_checkpoint to start anew, or restore the file.")

    def _newest_first(self, *, exclude: str) -> List[str]:
        """The .pth files of save_dir by the iteration they hold, then by modification time
        (copies do not always keep it); files with no readable iteration come last."""
        def newness(path: str) -> Tuple[bool, int, float]:
            iteration = stored_iteration(path)
            return iteration is not None, iteration or 0, os.path.getmtime(path)

        files = [p for p in self.get_all_checkpoint_files() if p != exclude]
        return sorted(files, key=newness, reverse=True)

    def _load_file(self, filename: str) -> Dict[str, Any]:
        """Reads a file as data only (see ``safe_load``), in the form DetectionCheckpointer
        reads it: ``{"model": ..., ...}``."""
        if filename in self._read_ahead:
            return self._read_ahead.pop(filename)
        if filename.endswith(".pkl"):
            return detectron_pickle_to_checkpoint(
                load_pickle_file(filename, allow_pickle=self.allow_pickle))
        loaded = load_torch_file(filename, allow_pickle=self.allow_pickle)
        if filename.endswith(".pyth"):  # pycls, as detectron2 reads it
            return pycls_to_checkpoint(loaded)
        loaded = loaded if isinstance(loaded, dict) and "model" in loaded else {"model": loaded}
        source = self._sources.get(filename, filename)
        converted = convert_foreign_checkpoint(loaded, self.model, source=source) \
            if isinstance(loaded["model"], dict) else None
        if converted is None:
            return loaded
        self.logger.info(converted.pop("__converted__"))
        return converted

    def _load_model(self, checkpoint: Dict[str, Any]):
        """DetectionCheckpointer's loading, then the shape policy of the module docstring."""
        # a copy on the CPU of what the model holds now, to restore the layers that differ
        fresh = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()} \
            if self._fine_tuning else {}
        for note in fit_levels(checkpoint, self.model):  # per-level tensors by level name
            self.logger.warning(note)
        incompatible = super()._load_model(checkpoint)
        shapes = list(incompatible.incorrect_shapes)
        reshaped = {key for key, _, _ in shapes}
        # detectron2 drops tensors of another shape before loading: they count as missing
        missing = [k for k in incompatible.missing_keys if k not in reshaped]
        if self._fine_tuning:
            self._keep_fresh_layers(fresh, shapes)
            return incompatible._replace(missing_keys=missing, incorrect_shapes=[])
        if shapes or missing:
            raise _Mismatch(shapes, missing)
        return incompatible

    def _keep_fresh_layers(self, fresh: Dict[str, torch.Tensor],
                           shapes: List[Tuple[str, Shape, Shape]]) -> None:
        """Restores every tensor of each layer that had a tensor of another shape."""
        if not shapes:
            return
        layers = sorted({key.rpartition(".")[0] for key, _, _ in shapes})
        restore = {k: v for k, v in fresh.items() if k.rpartition(".")[0] in layers}
        self.model.load_state_dict(restore, strict=False)
        self.logger.warning(
            f"Fine-tuning: {len(layers)} layers keep their fresh initialisation "
            f"({', '.join(layers)}) because the weights' shapes differ: " + "; ".join(
                f"{key} {tuple(theirs)} in the weights, {tuple(ours)} in the model"
                for key, theirs, ours in shapes))
