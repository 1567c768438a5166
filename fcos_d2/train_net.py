"""``python -m fcos_d2.train_net`` and the ``fcos-d2-train`` command: ``train_net.py`` from
any directory, with the same arguments (``--help`` lists them).

It runs the ``train_net.py`` of ``project_files.project_dir()``: the copy inside an installed
wheel, or the one of the source checkout.
"""
import runpy
import sys
from typing import List, Optional

from .project_files import project_dir


def main(argv: Optional[List[str]] = None) -> None:
    """Runs train_net.py as a script with ``argv`` (default: this command's arguments)."""
    script = project_dir() / "train_net.py"
    if not script.is_file():
        sys.exit(f"fcos-d2: {script} not found; reinstall fcos-d2 (pip install path/to/fcos-d2)")
    sys.argv = [str(script), *(sys.argv[1:] if argv is None else argv)]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
