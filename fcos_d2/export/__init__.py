"""Deployment: the whole detector as one graph, the dense graph, and a predictor."""
from .dense import FCOSDenseOutputs
from .onnx_graph import FCOSDetectorGraph
from .predictor import Predictor

__all__ = ["FCOSDenseOutputs", "FCOSDetectorGraph", "Predictor"]
