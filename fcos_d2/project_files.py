"""Where the files users run live: ``configs/``, ``tools/``, ``demo/`` and ``train_net.py``.

In a source checkout (``pip install -e .``, or ``PYTHONPATH`` on it) they are beside the
package, at the checkout's root. An installed wheel (``pip install .``) carries the same
tree inside the package, as ``fcos_d2/project/`` (setup.py copies it there), so that
``fcos_d2.get_config_file`` and ``python -m fcos_d2.train_net`` work from any directory.
"""
from pathlib import Path

__all__ = ["PROJECT_FILES", "project_dir"]

# Copied into the wheel under fcos_d2/project/ by setup.py: (folder or file, glob patterns).
# Recursive, so that config folders of models built on FCOS (configs/SipMask/, ...) and
# packages under tools/ come along.
PROJECT_FILES = (("configs", ("**/*.yaml", "**/*.py")), ("tools", ("**/*.py",)),
                 ("demo", ("**/*.py",)), ("train_net.py", ()))

_PACKAGED = Path(__file__).resolve().parent / "project"
_CHECKOUT = Path(__file__).resolve().parents[1]


def project_dir() -> Path:
    """The folder holding ``configs/``, ``tools/``, ``demo/`` and ``train_net.py``: the
    installed package's copy if there is one, else the source checkout."""
    return _PACKAGED if _PACKAGED.is_dir() else _CHECKOUT
