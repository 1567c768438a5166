"""MODEL.WEIGHTS as a URL: a download into the cache, checked by sha256, served here by a
local HTTP server on 127.0.0.1 that the test starts."""
import functools
import hashlib
import http.server
import threading

import pytest
import torch
from torch import nn

from fcos_d2.checkpoint import ChecksumMismatchError, FCOSCheckpointer, download_weights
from fcos_d2.checkpoint.download import hash_prefix_in_name, resolve_url


@pytest.fixture
def server(tmp_path):
    """Serves tmp_path/served; yields (base URL, folder, list of requested paths)."""
    folder, requests = tmp_path / "served", []
    folder.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", folder, requests
    httpd.shutdown()
    thread.join()


def weights_file(folder, name: str) -> str:
    """Saves a small checkpoint as folder/name; returns its sha256."""
    torch.manual_seed(0)
    torch.save({"model": nn.Linear(2, 3).state_dict()}, folder / name)
    return hashlib.sha256((folder / name).read_bytes()).hexdigest()


def cached_files(cache):
    """Files in the cache, but the locks (empty files that stay, as iopath's do)."""
    return [p.name for p in cache.rglob("*") if p.is_file() and p.suffix != ".lock"]


@pytest.mark.parametrize("name, prefix", [
    ("resnet50-0676ba61.pth", "0676ba61"),  # torch.hub's convention
    ("R-50.pkl", ""),  # a version number, not a hash (fewer than 6 digits)
    ("X-101-32x8d.pkl", ""),
    ("model_final_f10217.pkl", ""),  # detectron2's ids are not hashes
])
def test_the_hash_prefix_follows_the_model_zoo_file_name_convention(name, prefix):
    assert hash_prefix_in_name(name) == prefix


def test_detectron2_urls_point_to_its_model_zoo():
    assert resolve_url("detectron2://ImageNetPretrained/MSRA/R-50.pkl") == \
        "https://dl.fbaipublicfiles.com/detectron2/ImageNetPretrained/MSRA/R-50.pkl"


def test_a_url_is_downloaded_once_then_read_from_the_cache(server, tmp_path):
    base, folder, requests = server
    digest = weights_file(folder, "plain.pth")
    name = f"tiny-{digest[:8]}.pth"  # the hash in the name is checked
    (folder / "plain.pth").rename(folder / name)
    local = download_weights(f"{base}/{name}", cache_dir=str(tmp_path / "cache"), progress=False)
    assert hashlib.sha256(open(local, "rb").read()).hexdigest() == digest
    assert local.startswith(str(tmp_path / "cache" / "127.0.0.1_"))
    again = download_weights(f"{base}/{name}", cache_dir=str(tmp_path / "cache"), progress=False)
    assert again == local and requests == [f"/{name}"]  # no second request


def test_a_download_whose_hash_differs_from_its_name_is_deleted_with_both_hashes(server, tmp_path):
    base, folder, _ = server
    digest = weights_file(folder, "tiny-deadbeef.pth")
    with pytest.raises(ChecksumMismatchError, match=f"sha256 is {digest} but deadbeef was "
                                                    f"expected; the file was deleted"):
        download_weights(f"{base}/tiny-deadbeef.pth", cache_dir=str(tmp_path / "cache"),
                         progress=False)
    assert cached_files(tmp_path / "cache") == []  # nothing half-kept


def test_a_failed_download_leaves_nothing_in_the_cache(server, tmp_path):
    base, _, _ = server
    with pytest.raises(OSError, match=r"weights URL .*/missing\.pth: download failed: .*404"):
        download_weights(f"{base}/missing.pth", cache_dir=str(tmp_path / "cache"), progress=False)
    assert cached_files(tmp_path / "cache") == []


def test_the_configured_sha256_is_checked_for_url_weights(server, tmp_path, monkeypatch):
    base, folder, _ = server
    digest = weights_file(folder, "weights.pth")
    monkeypatch.setenv("FCOS_D2_CACHE", str(tmp_path / "cache"))
    url = f"{base}/weights.pth"
    wrong = FCOSCheckpointer(nn.Linear(2, 3), sha256={url: "ab" * 32})
    with pytest.raises(ChecksumMismatchError, match=f"sha256 is {digest} but {'ab' * 32}"):
        wrong.load(url)
    model = nn.Linear(2, 3)
    FCOSCheckpointer(model, sha256={url: digest[:12]}).load(url)
    torch.manual_seed(0)
    assert torch.equal(model.weight, nn.Linear(2, 3).weight)
    assert list((tmp_path / "cache" / "weights").rglob("weights.pth"))  # $FCOS_D2_CACHE/weights
