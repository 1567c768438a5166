"""Training schedules in epochs: ``SOLVER.EPOCHS`` and its companions, turned into the
iteration keys detectron2 reads.

An epoch is one pass over the N images of the training set as the training loader sees it:
after ``filter_invalid_boxes_on_load`` and detectron2's own filtering of images without
annotations (``DATALOADER.FILTER_EMPTY_ANNOTATIONS``); repeat factors do not count. With
B = ``SOLVER.IMS_PER_BATCH`` (the total over the W workers, as in detectron2), e epochs take
``ceil(e * N / B)`` iterations: the first iteration by which e * N images have been drawn.

Each pair below is one setting in two units. A config is read as layers (the ``_BASE_``
files, the config file, the command line); the last layer that sets a pair decides its
unit, and a layer that sets both keys of a pair is an error naming both. An epoch key that
wins replaces its iteration key with the derived value; one that loses is reset to 0, so
that in the final config an epoch key is non-zero exactly when its iteration key was
derived from it.

``derive_schedule`` is the pure function; ``apply_epoch_schedule`` counts N and writes
the result into a config; ``ScheduleOnResume`` keeps it in the checkpoints and refuses a
resume whose derived schedule differs.
"""
import math
import os
from fractions import Fraction
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import yaml
from detectron2.engine import HookBase

__all__ = ["SCHEDULE_KEYS", "EpochSchedule", "ScheduleOnResume", "apply_epoch_schedule",
           "choose_units", "config_layers", "derive_schedule", "iterations_for_epochs",
           "schedule_record", "training_set_size"]

# (iteration key, epoch key): the five settings of a schedule, in both units.
SCHEDULE_KEYS = (
    ("SOLVER.MAX_ITER", "SOLVER.EPOCHS"),
    ("SOLVER.STEPS", "SOLVER.STEPS_EPOCHS"),
    ("SOLVER.WARMUP_ITERS", "SOLVER.WARMUP_EPOCHS"),
    ("SOLVER.CHECKPOINT_PERIOD", "SOLVER.CHECKPOINT_PERIOD_EPOCHS"),
    ("TEST.EVAL_PERIOD", "TEST.EVAL_PERIOD_EPOCHS"),
)
# The same settings in a LazyConfig (configs/lazy/): the epoch keys live in ``train``; the
# LR milestones are made absolute (num_updates = max_iter) and the warm-up a fraction.
LAZY_SCHEDULE_KEYS = (
    ("train.max_iter", "train.epochs"),
    ("lr_multiplier.scheduler.milestones", "train.steps_epochs"),
    ("lr_multiplier.warmup_length", "train.warmup_epochs"),
    ("train.checkpointer.period", "train.checkpoint_period_epochs"),
    ("train.eval_period", "train.eval_period_epochs"),
)
Layer = Tuple[str, Set[str]]  # (where, the full keys it sets)


def iterations_for_epochs(epochs: float, num_images: int, total_batch: int) -> int:
    """``ceil(epochs * num_images / total_batch)``, computed exactly (0.1 epochs is 1/10)."""
    return math.ceil(Fraction(str(epochs)) * num_images / total_batch)


class EpochSchedule:
    """A schedule derived from epochs.

    Attributes:
        num_images: N, the training images per epoch.
        total_batch: B, images per iteration over all workers.
        num_workers: W; each worker loads B / W images per iteration.
        epochs: epoch key -> its value, for the keys that were set.
        iterations: iteration key -> the value derived from its epoch key.
    """

    def __init__(self, num_images: int, total_batch: int, num_workers: int,
                 epochs: Dict[str, Any], iterations: Dict[str, Any],
                 pairs: Sequence[Tuple[str, str]] = SCHEDULE_KEYS):
        self.num_images, self.total_batch, self.num_workers = num_images, total_batch, num_workers
        self.epochs, self.iterations, self.pairs = epochs, iterations, pairs

    def describe(self) -> str:
        """One log line with every number that went into the schedule."""
        pairs = "; ".join(f"{epoch_key} {_text(self.epochs[epoch_key])} -> {key_it} "
                          f"{_text(self.iterations[key_it])}"
                          for key_it, epoch_key in self.pairs if epoch_key in self.epochs)
        return (f"Schedule in epochs: {self.num_images} training images (after filtering), "
                f"total batch {self.total_batch} ({self.total_batch // self.num_workers}"
                f" per worker x {self.num_workers}): "
                f"{Fraction(self.num_images, self.total_batch)} iterations per epoch, rounded up "
                f"per key; {pairs}")


def derive_schedule(epochs: Mapping[str, Any], *, num_images: int, total_batch: int,
                    num_workers: int = 1, pairs: Sequence[Tuple[str, str]] = SCHEDULE_KEYS
                    ) -> EpochSchedule:
    """Derives the iteration keys from the epoch keys that are set.

    Args:
        epochs: epoch key (of ``pairs``) -> value; 0 or () means "not set" and is left
            out. Periods and lengths are numbers, the LR steps a sequence.
        num_images: N, training images per epoch (after filtering).
        total_batch: B, SOLVER.IMS_PER_BATCH, the total over the workers.
        num_workers: W, which must divide B (detectron2 splits the batch evenly).
        pairs: (iteration key, epoch key) of each setting; the yacs keys by default.

    Returns:
        The schedule: each set epoch key's iteration key as ``ceil(e * N / B)``.

    Raises:
        ValueError: naming the key or number at fault.
    """
    if num_images <= 0:
        raise ValueError("schedule in epochs: the training set (DATASETS.TRAIN) has no images "
                         "after filtering; check the dataset or give the iteration keys")
    if total_batch <= 0 or total_batch % num_workers:
        raise ValueError(f"the total batch (SOLVER.IMS_PER_BATCH, or the LazyConfig's "
                         f"dataloader.train.total_batch_size) {total_batch} is not a positive "
                         f"multiple of the {num_workers} workers")
    used = {key: value for key, value in epochs.items() if _is_set(value)}
    iterations = {}
    for key_it, epoch_key in pairs:
        if epoch_key not in used:
            continue
        steps = _is_sequence(used[epoch_key])
        values = used[epoch_key] if steps else [used[epoch_key]]
        if any(float(v) < 0 for v in values):
            raise ValueError(f"{epoch_key} {_text(used[epoch_key])}: epochs cannot be negative")
        derived = [iterations_for_epochs(v, num_images, total_batch) for v in values]
        iterations[key_it] = tuple(derived) if steps else derived[0]
    return EpochSchedule(num_images, total_batch, num_workers, used, iterations, pairs)


def choose_units(layers: Sequence[Layer],
                 pairs: Sequence[Tuple[str, str]] = SCHEDULE_KEYS) -> Dict[str, str]:
    """For each pair (iteration key, epoch key), the key whose unit holds: the one set by
    the last layer that sets either (the iteration key if none does).

    Args:
        layers: (where, keys set there), first to last.
        pairs: the settings; the yacs keys by default.

    Raises:
        ValueError: a layer sets both keys of a pair; the error names both and the layer.
    """
    chosen = {key_it: key_it for key_it, _ in pairs}
    for where, keys in layers:
        for key_it, epoch_key in pairs:
            if key_it in keys and epoch_key in keys:
                raise ValueError(f"{where} sets both {key_it} and {epoch_key}, the same setting "
                                 f"in iterations and in epochs: remove one of them")
            if key_it in keys or epoch_key in keys:
                chosen[key_it] = key_it if key_it in keys else epoch_key
    return chosen


def config_layers(config_file: str, opts: Sequence[str]) -> List[Layer]:
    """The layers of a yacs config: its ``_BASE_`` files (deepest first), the file, then the
    command line's ``KEY VALUE`` pairs, each with the full keys it sets."""
    layers = _file_layers(config_file) if config_file else []
    return layers + [("the command line", set(opts[0::2]))]


def _file_layers(path: str) -> List[Layer]:
    with open(path) as f:
        content = yaml.safe_load(f) or {}
    base = content.pop("_BASE_", None)
    layers = []
    if base:
        if not (base.startswith(("/", "~")) or "://" in base):
            base = os.path.join(os.path.dirname(path), base)
        layers = _file_layers(os.path.expanduser(base))
    return layers + [(f"config file {path}", set(_flat_keys(content)))]


def _flat_keys(node: Mapping, prefix: str = ""):
    for key, value in node.items():
        if isinstance(value, Mapping):
            yield from _flat_keys(value, f"{prefix}{key}.")
        else:
            yield prefix + key


def training_set_size(dataset_names: Sequence[str], filter_empty: bool) -> int:
    """N: the images of ``dataset_names`` as the training loader gets them (invalid boxes
    dropped, then images without annotations when ``filter_empty``)."""
    from detectron2.data import get_detection_dataset_dicts
    from ..data.boxes import filter_invalid_boxes_on_load

    for name in dataset_names:
        filter_invalid_boxes_on_load(name)
    return len(get_detection_dataset_dicts(list(dataset_names), filter_empty=filter_empty))


def apply_epoch_schedule(cfg, layers: Sequence[Layer], num_workers: int) -> Optional[EpochSchedule]:
    """Writes the schedule into ``cfg`` (not frozen): winning epoch keys replace their
    iteration keys, losing ones are reset to 0 (see the module docstring).

    Returns:
        The derived schedule, or None when no epoch key holds (the dataset is not loaded).
    """
    chosen = choose_units(layers)
    epochs = {}
    for key_it, epoch_key in SCHEDULE_KEYS:
        if chosen[key_it] == epoch_key:
            epochs[epoch_key] = _get(cfg, epoch_key)
        else:
            _set(cfg, epoch_key, type(_get(cfg, epoch_key))())  # (), 0 or 0.0
    if not any(_is_set(value) for value in epochs.values()):
        return None
    size = training_set_size(cfg.DATASETS.TRAIN, cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS)
    schedule = derive_schedule(epochs, num_images=size, total_batch=cfg.SOLVER.IMS_PER_BATCH,
                               num_workers=num_workers)
    for key_it, value in schedule.iterations.items():
        _set(cfg, key_it, value)
    return schedule


def apply_lazy_epoch_schedule(cfg, config_file: str, overrides: Sequence[str],
                              num_workers: int) -> Optional[EpochSchedule]:
    """``apply_epoch_schedule`` for a LazyConfig and its ``key=value`` overrides: the
    file's non-zero epoch keys hold unless the overrides set the iteration key; N is
    ``len(instantiate(dataloader.train.dataset))``, B ``dataloader.train.total_batch_size``."""
    from detectron2.config import instantiate

    in_file = {epoch_key for _, epoch_key in LAZY_SCHEDULE_KEYS
               if _is_set(_get(cfg, epoch_key, 0))}
    given = {override.split("=", 1)[0].strip() for override in overrides}
    chosen = choose_units([(f"config file {config_file}", in_file), ("the command line", given)],
                          LAZY_SCHEDULE_KEYS)
    epochs = {epoch_key: _get(cfg, epoch_key, 0) for key_it, epoch_key in LAZY_SCHEDULE_KEYS
              if chosen[key_it] == epoch_key}
    for key_it, epoch_key in LAZY_SCHEDULE_KEYS:
        value = _get(cfg, epoch_key, None)
        if chosen[key_it] != epoch_key and value is not None:
            _set(cfg, epoch_key, [] if _is_sequence(value) else 0)
    if not any(_is_set(value) for value in epochs.values()):
        return None
    schedule = derive_schedule(
        epochs, num_images=len(instantiate(cfg.dataloader.train.dataset)),
        total_batch=cfg.dataloader.train.total_batch_size, num_workers=num_workers,
        pairs=LAZY_SCHEDULE_KEYS)
    derived = schedule.iterations
    if "train.max_iter" in derived:
        cfg.train.max_iter = derived["train.max_iter"]
    if "lr_multiplier.scheduler.milestones" in derived:
        cfg.lr_multiplier.scheduler.milestones = list(derived["lr_multiplier.scheduler.milestones"])
        cfg.lr_multiplier.scheduler.num_updates = cfg.train.max_iter
    if "lr_multiplier.warmup_length" in derived:  # a fraction of the training
        warmup = derived["lr_multiplier.warmup_length"]
        cfg.lr_multiplier.warmup_length = warmup / cfg.train.max_iter
    for key in ("train.checkpointer.period", "train.eval_period"):
        if key in derived:
            _set(cfg, key, derived[key])
    return schedule


def schedule_record(cfg, pairs: Sequence[Tuple[str, str]] = SCHEDULE_KEYS,
                    batch_key: str = "SOLVER.IMS_PER_BATCH") -> Dict[str, Any]:
    """Both units of every setting and the batch, as plain values (for a checkpoint), and
    "derived": whether an epoch key holds."""
    keys = [key for pair in pairs for key in pair] + [batch_key]
    record = {key: _plain(_get(cfg, key, 0)) for key in keys}
    return {"derived": any(_is_set(record[epoch_key]) for _, epoch_key in pairs), **record}


class ScheduleOnResume(HookBase):
    """Saves ``schedule_record`` in every checkpoint; on ``--resume``, a checkpoint whose
    schedule was derived from epochs, resumed by a run that derives another one, is a
    ValueError naming both (the training set or SOLVER.IMS_PER_BATCH changed)."""

    def __init__(self, record: Dict[str, Any]):
        self._record = record

    def state_dict(self) -> Dict[str, Any]:
        return dict(self._record)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if not (state.get("derived") and self._record.get("derived")):
            return
        changed = [key for key in state if state[key] != self._record.get(key)]
        if changed:
            raise ValueError(
                "--resume: the checkpoint's schedule was derived from epochs as "
                f"{_listing(state, changed)}, but this run derives "
                f"{_listing(self._record, changed)}"
                " (has the training set or SOLVER.IMS_PER_BATCH changed?). Resume with the "
                "same data and batch, or train in a new OUTPUT_DIR.")


def _listing(record: Mapping[str, Any], keys: Sequence[str]) -> str:
    return ", ".join(f"{key} {_text(record.get(key))}" for key in keys)


def _is_sequence(value: Any) -> bool:  # tuples, lists and OmegaConf's ListConfig
    return isinstance(value, Sequence) and not isinstance(value, str)


def _is_set(value: Any) -> bool:
    return bool(len(value)) if _is_sequence(value) else bool(value and float(value))


def _plain(value: Any) -> Any:
    return list(value) if _is_sequence(value) else value


def _text(value: Any) -> str:
    return str(tuple(value)) if _is_sequence(value) else str(value)


def _get(cfg, key: str, default: Any = KeyError) -> Any:
    node = cfg
    for part in key.split("."):
        if default is not KeyError and part not in node:
            return default
        node = node[part]
    return node


def _set(cfg, key: str, value: Any) -> None:
    *path, last = key.split(".")
    node = cfg
    for part in path:
        node = node[part]
    node[last] = value
