"""fcos-d2: FCOS as a detectron2 extension. Importing this package registers FCOS."""
# compat first: it makes detectron2 v0.6 importable without its C++ extension.
from . import compat  # noqa: F401  (side effect: detectron2 compatibility)

__version__ = "0.1.0"
