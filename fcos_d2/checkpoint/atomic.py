"""Files written so that a reader sees the old content or the new one, never a part.

The content goes to a temporary file in the target's folder (same file system, so the
rename is atomic), is flushed and fsynced, and the temporary file is renamed over the
target; then the folder is fsynced so that the rename itself survives a power loss. A
process killed before the rename leaves the target as it was, plus a hidden temporary
file ``.<name>.tmp-*`` that nothing reads.
"""
import os
import uuid
from typing import BinaryIO, Callable


def atomic_write(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Calls ``write`` on a temporary binary file, then renames it to ``path``.

    Args:
        path: the file to create or replace; its folder must exist.
        write: writes the whole content to the file object it is given.
    """
    folder, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(folder, f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex}")
    # not tempfile.mkstemp: its files are private (0600) whatever the umask says
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:  # also KeyboardInterrupt: never leave a half-written file behind
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    _fsync_folder(folder)


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
