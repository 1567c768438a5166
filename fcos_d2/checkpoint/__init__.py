"""Checkpoint conversion and loading: official FCOS checkpoints to fcos-d2 names."""
from .official import (FROZEN_BN_EPS, CheckpointMismatchError, check_matches_model,
                       convert_official_key, convert_official_state_dict)

__all__ = ["FROZEN_BN_EPS", "CheckpointMismatchError", "check_matches_model",
           "convert_official_key", "convert_official_state_dict"]
