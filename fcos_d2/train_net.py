"""``python -m fcos_d2.train_net`` and the ``fcos-d2-train`` command: what ``train_net.py``
does, from any directory, with the same arguments (``--help`` lists them)."""
from typing import List, Optional

from . import compat  # noqa: F401  (first: detectron2 v0.6 shims)
import fcos_d2  # noqa: F401,E402  (registers FCOS, the members and the datasets)
from .engine.trainer import run_from_command_line  # noqa: E402


def main(argv: Optional[List[str]] = None) -> None:
    """Trains or evaluates with ``argv`` (default: this command's arguments)."""
    run_from_command_line(argv)


if __name__ == "__main__":
    main()
