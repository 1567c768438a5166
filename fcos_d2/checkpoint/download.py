"""Weights given as a URL: downloaded once into a cache, atomically, checked by sha256.

The cache is ``$FCOS_D2_CACHE/weights`` (default ``~/.cache/fcos_d2/weights``); a URL
``https://host/a/b/name.pth`` is kept as ``<cache>/host/a/b/name.pth``, so files of the
same name from different places do not collide. ``detectron2://name`` is detectron2's
model zoo, ``https://dl.fbaipublicfiles.com/detectron2/name``; ``fcos-d2://NAME`` is a
model of ``fcos_d2.model_zoo`` (the official FCOS and AdelaiDet weights).

The expected sha256 is the one given (``MODEL.WEIGHTS_SHA256`` in train_net.py), else the
model zoo's, else the one in the file name by the model-zoo convention
``name-<sha256 prefix>.ext`` that torch.hub and the official FCOS's ``cache_url`` follow:
the first ``-<hex digits>.`` of the name, used only when it has at least 6 digits
(``R-50.pkl`` carries no hash). Where none is known, the first download's sha256 is
recorded next to it (``<file>.sha256``, trust on first use) and is expected from then on:
from the cached copy and from any later download of the URL. A download whose hash differs
is deleted, and the error gives both hashes.
"""
import hashlib
import logging
import os
import re
import urllib.request
from typing import BinaryIO, Optional
from urllib.parse import urlparse

from detectron2.utils.file_io import Detectron2Handler
from iopath.common.file_io import file_lock

from ..progress import Progress
from . import published
from .atomic import atomic_write

logger = logging.getLogger(__name__)

CACHE_ENV = "FCOS_D2_CACHE"
_HASH_IN_NAME = re.compile(r"-([a-f0-9]*)\.")  # torch.hub's HASH_REGEX
_MIN_HASH_DIGITS = 6  # fewer: a version number such as R-50, not a hash (official FCOS)
_CHUNK = 1 << 20


class ChecksumMismatchError(RuntimeError):
    """A file's sha256 is not the one expected."""


def weights_cache_dir() -> str:
    """``$FCOS_D2_CACHE/weights``, default ``~/.cache/fcos_d2/weights``."""
    base = os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "fcos_d2")
    return os.path.join(os.path.expanduser(os.path.expandvars(base)), "weights")


def is_url(path: str) -> bool:
    """Whether ``path`` is downloaded here: http(s)://, detectron2:// or fcos-d2://."""
    return path.startswith(("http://", "https://", Detectron2Handler.PREFIX, published.PREFIX))


def resolve_url(url: str) -> str:
    """The http(s) URL of ``url`` (detectron2:// and fcos-d2:// -> their model zoo's
    address; KeyError for a name fcos-d2's model zoo does not have)."""
    if url.startswith(Detectron2Handler.PREFIX):
        return Detectron2Handler.S3_DETECTRON2_PREFIX + url[len(Detectron2Handler.PREFIX):]
    if url.startswith(published.PREFIX):
        return published.get_checkpoint_url(url)
    return url


def checked_weights_sha256(value: str) -> str:
    """``value`` of MODEL.WEIGHTS_SHA256 in lower case, or raises ValueError naming the key."""
    if value and not re.fullmatch(r"[0-9a-fA-F]{6,64}", value):
        raise ValueError(f"MODEL.WEIGHTS_SHA256: '{value}' is not a sha256 (6 to 64 hex "
                         f"digits of it); use '' to check nothing")
    return value.lower()


def known_sha256(url: str, target: str) -> str:
    """The sha256 (prefix) ``url`` is known by: the model zoo's, else the one in its
    file name, else the one recorded at its first download; "" if none."""
    zoo = published.get_checkpoint_sha256(url) if url.startswith(published.PREFIX) else ""
    recorded = _read_record(target)
    return zoo or hash_prefix_in_name(os.path.basename(target)) or recorded


def hash_prefix_in_name(filename: str) -> str:
    """The sha256 prefix of a model-zoo name ``name-<hex>.ext``, or "" if it has none.

    >>> hash_prefix_in_name("resnet50-0676ba61.pth"), hash_prefix_in_name("R-50.pkl")
    ('0676ba61', '')
    """
    found = _HASH_IN_NAME.search(filename)
    return found.group(1) if found and len(found.group(1)) >= _MIN_HASH_DIGITS else ""


def cache_path(url: str, cache_dir: str) -> str:
    """Where ``url`` is kept in ``cache_dir``: ``<cache>/<host>/<path of the URL>``."""
    parts = urlparse(resolve_url(url))
    relative = parts.path.lstrip("/")
    if not relative or relative.endswith("/") or ".." in relative.split("/"):
        raise ValueError(f"weights URL {url}: it does not name a file")
    return os.path.join(cache_dir, parts.netloc.replace(":", "_"), relative)


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(path: str, expected: str, *, source: str) -> None:
    """Raises ChecksumMismatchError, giving both hashes, if ``path``'s sha256 does not start
    with ``expected`` (a prefix of 6 to 64 hex digits). ``source``: named in the error."""
    actual = file_sha256(path)
    if not actual.startswith(expected.lower()):
        raise ChecksumMismatchError(
            f"{source}: sha256 is {actual} but {expected} was expected")


def download_weights(url: str, *, sha256: str = "", cache_dir: Optional[str] = None,
                     progress: bool = True) -> str:
    """Returns the local copy of ``url``, downloading it into the cache if it is not there.

    Args:
        url: http(s):// or detectron2:// address of the file.
        sha256: expected sha256 (or its first >= 6 hex digits); "" to use the one known
            (``known_sha256``), if any; with none, the download's hash is recorded. A
            cached copy is checked again whenever a hash is known.
        cache_dir: default ``weights_cache_dir()``.
        progress: show a progress bar while downloading.

    Raises:
        ChecksumMismatchError: the file's hash differs (the file is deleted).
        OSError: the download failed (nothing is left in the cache).
    """
    target = cache_path(url, cache_dir or weights_cache_dir())
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with file_lock(target):  # one process downloads, the others then find it in the cache
        expected = sha256 or known_sha256(url, target)
        if not os.path.isfile(target):
            _download(resolve_url(url), target, progress=progress)
        if expected:
            _check_or_delete(url, target, expected)
        else:
            _record(target)
    return target


def _check_or_delete(url: str, target: str, expected: str) -> None:
    try:
        check_sha256(target, expected, source=f"{url} (downloaded to {target})")
    except ChecksumMismatchError as error:
        os.remove(target)
        hint = (f" (the sha256 recorded at its first download, in {_record_path(target)}: "
                "delete that file if the publisher has replaced the file)"
                if expected == _read_record(target) else "")
        raise ChecksumMismatchError(f"{error}{hint}; the file was deleted") from None


def _record_path(target: str) -> str:
    return target + ".sha256"


def _read_record(target: str) -> str:
    """The sha256 recorded at ``target``'s first download, "" if none."""
    try:
        with open(_record_path(target)) as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def _record(target: str) -> None:
    """Records ``target``'s sha256 (trust on first use: later downloads must match it)."""
    digest = file_sha256(target)
    atomic_write(_record_path(target), lambda f: f.write(digest.encode() + b"\n"))
    logger.info(f"No sha256 is published for {os.path.basename(target)}; recorded this "
                f"download's, {digest}, in {_record_path(target)}: later downloads must match it")


def _download(url: str, target: str, *, progress: bool) -> None:
    logger.info(f"Downloading {url} to {target}")
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            total = int(response.headers.get("Content-Length") or 0)  # 0: not said
            with Progress(total, f"downloading {os.path.basename(target)}", "B",
                          enabled=progress) as bar:  # a bar, or a line a minute in a log
                atomic_write(target, lambda f: _copy(response, f, bar))
    except OSError as error:  # URLError, HTTPError and socket errors are OSErrors
        raise OSError(f"weights URL {url}: download failed: {error}") from error


def _copy(source: BinaryIO, target: BinaryIO, bar: Progress) -> None:
    for chunk in iter(lambda: source.read(_CHUNK), b""):
        target.write(chunk)
        bar.update(len(chunk))
