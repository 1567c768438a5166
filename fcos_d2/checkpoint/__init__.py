"""Checkpoints: conversion of official FCOS checkpoints, and FCOSCheckpointer (atomic saves,
resume fallback, data-only loading, URL downloads with sha256, strict shape checks)."""
from .checkpointer import FCOSCheckpointer, WeightsMismatchError
from .download import ChecksumMismatchError, download_weights, weights_cache_dir
from .official import (FROZEN_BN_EPS, CheckpointMismatchError, check_matches_model,
                       convert_official_key, convert_official_state_dict)
from .safe_load import CheckpointReadError, UnsafeCheckpointError

__all__ = ["FROZEN_BN_EPS", "CheckpointMismatchError", "check_matches_model",
           "convert_official_key", "convert_official_state_dict", "FCOSCheckpointer",
           "WeightsMismatchError", "ChecksumMismatchError", "download_weights",
           "weights_cache_dir", "CheckpointReadError", "UnsafeCheckpointError"]
