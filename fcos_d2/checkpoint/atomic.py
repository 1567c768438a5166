"""Files written so that a reader sees the old content or the new one, never a part.

The content goes to a temporary file in the target's folder (same file system, so the
rename is atomic), is flushed and fsynced, and the temporary file is renamed over the
target; then the folder is fsynced so that the rename itself survives a power loss. A
process killed before the rename leaves the target as it was, plus a hidden temporary
file ``.<name>.tmp-*`` that nothing reads.

For fault tests (tools/soak_resume.py), the environment variable
``FCOS_D2_TEST_PAUSE_IN_SAVE="STAGE:NAME:COUNT:MARKER"`` makes the COUNT-th (1-based)
write of a file named NAME stop at STAGE ("written": the temporary file is complete and
fsynced, not yet renamed; "renamed": the file is in place, the folder not yet fsynced and
the caller not yet on to its next step, e.g. ``last_checkpoint``), create the file MARKER
and sleep, so that a test can kill the process exactly there. Unset (the default), it
costs one dictionary look-up per write.
"""
import os
import time
import uuid
from typing import BinaryIO, Callable, Dict

PAUSE_VARIABLE = "FCOS_D2_TEST_PAUSE_IN_SAVE"
PAUSE_SECONDS = 120.0  # long enough for any test to kill the process in the pause
_writes: Dict[str, int] = {}  # file name -> writes of it by this process (the pause's COUNT)


def atomic_write(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Calls ``write`` on a temporary binary file, then renames it to ``path``.

    Args:
        path: the file to create or replace; its folder must exist.
        write: writes the whole content to the file object it is given.
    """
    folder, name = os.path.split(os.path.abspath(path))
    _writes[name] = _writes.get(name, 0) + 1
    temporary = os.path.join(folder, f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex}")
    # not tempfile.mkstemp: its files are private (0600) whatever the umask says
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        _pause_for_tests("written", name)
        os.replace(temporary, path)
        _pause_for_tests("renamed", name)
    except BaseException:  # also KeyboardInterrupt: never leave a half-written file behind
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    _fsync_folder(folder)


def _pause_for_tests(stage: str, name: str) -> None:
    """The pause of the module docstring, where PAUSE_VARIABLE asks for this one."""
    spec = os.environ.get(PAUSE_VARIABLE)
    if not spec:
        return
    try:
        want_stage, want_name, count, marker = spec.split(":", 3)
        wanted = (want_stage, want_name, int(count)) == (stage, name, _writes[name])
    except ValueError:
        raise ValueError(f"{PAUSE_VARIABLE}={spec!r}: expected STAGE:NAME:COUNT:MARKER, "
                         f"e.g. renamed:model_final.pth:1:/tmp/paused") from None
    if wanted:
        with open(marker, "w") as f:
            f.write(f"{stage} {name} {os.getpid()}\n")
        time.sleep(PAUSE_SECONDS)


def _fsync_folder(folder: str) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. a platform that cannot open folders: the rename is still atomic
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
