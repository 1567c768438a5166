"""Deployment: exportable wrappers around a trained FCOS."""
from .dense import FCOSDenseOutputs

__all__ = ["FCOSDenseOutputs"]
