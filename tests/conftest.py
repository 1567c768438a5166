import sys
from pathlib import Path

# Test helpers (e.g. reference_case.py) import by module name.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fcos_d2  # noqa: E402,F401  (before detectron2: compatibility shims)
