"""``python -m fcos_d2.submit``: submits train_net.py (or the LazyConfig tool) to SLURM
through submitit, or runs it here with ``--local N`` (``--help`` lists the flags; the
launcher is ``fcos_d2.engine.submit``; docs/cluster.md says how to use it)."""
from typing import List, Optional

from . import compat  # noqa: F401  (first: detectron2 v0.6 shims)
import fcos_d2  # noqa: F401,E402  (registers FCOS, the members and the datasets)
from .engine.submit import main as submit_main  # noqa: E402


def main(argv: Optional[List[str]] = None) -> None:
    """Submits the job of ``argv`` (default: this command's arguments)."""
    submit_main(argv)


if __name__ == "__main__":
    main()
