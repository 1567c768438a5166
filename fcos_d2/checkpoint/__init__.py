"""Checkpoints: conversion of official FCOS and AdelaiDet checkpoints (and AdelaiDet
configs) to fcos-d2's names, the registry of foreign layouts that members add theirs to
(``register_checkpoint_layout``), and FCOSCheckpointer (atomic saves, resume fallback,
data-only loading, URL downloads with sha256, strict shape checks, foreign layouts
converted in memory)."""
from .adelaidet import convert_adelaidet_key, convert_adelaidet_state_dict
from .adelaidet_config import AdelaiDetConfigError, fcos_d2_config_from_adelaidet
from .checkpointer import FCOSCheckpointer, WeightsMismatchError
from .download import ChecksumMismatchError, download_weights, weights_cache_dir
from .layouts import (CheckpointLayout, checkpoint_layout, convert_foreign_checkpoint,
                      register_checkpoint_layout)
from .official import (FROZEN_BN_EPS, CheckpointMismatchError, check_matches_model,
                       convert_official_key, convert_official_state_dict)
from .safe_load import CheckpointReadError, UnsafeCheckpointError

__all__ = ["FROZEN_BN_EPS", "AdelaiDetConfigError", "CheckpointMismatchError",
           "check_matches_model", "convert_adelaidet_key", "convert_adelaidet_state_dict",
           "convert_official_key", "convert_official_state_dict",
           "fcos_d2_config_from_adelaidet", "FCOSCheckpointer", "WeightsMismatchError",
           "ChecksumMismatchError", "download_weights", "weights_cache_dir",
           "CheckpointReadError", "UnsafeCheckpointError", "checkpoint_layout",
           "convert_foreign_checkpoint", "CheckpointLayout", "register_checkpoint_layout"]
