"""Checkpoint conversion and loading: official FCOS and AdelaiDet checkpoints to fcos-d2
names (and AdelaiDet configs to fcos-d2 configs)."""
from .adelaidet import convert_adelaidet_key, convert_adelaidet_state_dict
from .adelaidet_config import AdelaiDetConfigError, fcos_d2_config_from_adelaidet
from .official import (FROZEN_BN_EPS, CheckpointMismatchError, check_matches_model,
                       convert_official_key, convert_official_state_dict)

__all__ = ["FROZEN_BN_EPS", "AdelaiDetConfigError", "CheckpointMismatchError",
           "check_matches_model", "convert_adelaidet_key", "convert_adelaidet_state_dict",
           "convert_official_key", "convert_official_state_dict",
           "fcos_d2_config_from_adelaidet"]
