"""The compile paid once per machine (fcos_d2/modeling/compile_cache.py and the bf16 runner
of inference_backends.py): the size ladder, the crop back from a bucketed batch, the
index of compiled models and its estimate, and, in two processes on a toy model, a warm
cache that compiles nothing and new weights that need no recompile."""
import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from fcos_d2.modeling import compile_cache
from fcos_d2.modeling.compile_cache import bucket_side, bucketed_size
from fcos_d2.modeling.inference_backends import crop_levels


@pytest.mark.parametrize("side, multiple, steps, bucket", [
    (800, 32, 8, 832),  # COCO's short side: 26 = 13 * 2 units of 32
    (1216, 32, 8, 1280),  # 38 units -> 40 = 10 * 4
    (1333, 32, 8, 1408),
    (100, 32, 8, 128),  # under 8 units: multiples of 32
    (256, 32, 8, 256),  # on the ladder already
    (800, 32, 0, 800),  # no buckets: the multiple only
    (1333, 128, 4, 1536),
])
def test_bucket_side_is_the_next_size_of_the_ladder(side, multiple, steps, bucket):
    assert bucket_side(side, multiple, steps) == bucket


def test_buckets_cover_every_side_closely_with_few_sizes():
    for side in range(1, 3000):
        bucket = bucket_side(side, 32, 8)
        assert bucket >= side and bucket % 32 == 0 and bucket <= side * 9 / 8 + 32
    widths = {bucket_side(w, 32, 8) for w in range(1000, 1334)}  # COCO's long sides
    assert widths == {1024, 1152, 1280, 1408}
    assert bucketed_size(800, 1216, 32, 8) == (832, 1280)


def test_crop_levels_gives_back_the_unbucketed_outputs():
    """Zero padding to the bucket then cropping equals running the batch as it is, for
    convolutions (whose own zero padding the extra zeros repeat)."""
    torch.manual_seed(0)
    stem, down = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, stride=2, padding=1)
    heads = lambda t: [[stem(t), down(stem(t))]]  # noqa: E731  one output, strides 1 and 2
    image = torch.rand(1, 3, 40, 52)
    padded = nn.functional.pad(image, (0, 64 - 52, 0, 64 - 40))
    with torch.no_grad():
        want, got = heads(image), crop_levels(heads(padded), 40, 52, (1, 2))
    for a, b in zip(want[0], got[0]):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-6)


def test_graph_shape_is_the_exact_size_first_then_buckets_and_what_is_compiled_wins():
    exact, bucket = (1, 3, 800, 1216), (1, 3, 832, 1280)
    other = (1, 3, 800, 1088)
    assert compile_cache.graph_shape(exact, bucket, [], []) == exact  # a process's first size
    assert compile_cache.graph_shape(exact, bucket, [other], []) == bucket  # a later new size
    assert compile_cache.graph_shape(exact, bucket, [other, exact], []) == exact
    assert compile_cache.graph_shape(exact, bucket, [], [bucket]) == bucket  # cached wins
    assert compile_cache.graph_shape(exact, bucket, [bucket], [exact]) == bucket  # here first


def test_index_records_compiles_and_estimates_from_them(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3))
    key = compile_cache.model_key(model, "bf16_compiled")
    assert not compile_cache.is_warm(tmp_path, key)
    assert compile_cache.compile_estimate(tmp_path, key, (1, 3, 64, 64), model) == (
        2 * compile_cache.COLD_SECONDS_PER_CONV, "a first guess for 2 convolutions")
    compile_cache.record_compile(tmp_path, key, (1, 3, 64, 64), 12.34)
    assert compile_cache.is_warm(tmp_path, key)
    assert compile_cache.cached_shapes(tmp_path, key) == {(1, 3, 64, 64)}
    assert compile_cache.compile_estimate(tmp_path, key, (1, 3, 64, 64), model)[0] == 12.3
    assert "another size" in compile_cache.compile_estimate(tmp_path, key, (1, 3, 96, 64),
                                                            model)[1]
    other = compile_cache.model_key(nn.Sequential(nn.Conv2d(3, 5, 3)), "bf16_compiled")
    assert other != key and not compile_cache.is_warm(tmp_path, other)


def test_a_compile_recorded_in_one_python_environment_is_cold_in_another(monkeypatch,
                                                                          tmp_path):
    """Inductor compiles its C++ kernels again under another torch install folder (its
    include path is in the compiler's command line), so "auto" must not count on them."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3))
    key = compile_cache.model_key(model, "bf16_compiled")
    compile_cache.record_compile(tmp_path, key, (1, 3, 64, 64), 30.0)
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "other_venv/torch/__init__.py"))
    assert compile_cache.torch_folder() == str(tmp_path / "other_venv/torch")
    moved = compile_cache.model_key(model, "bf16_compiled")
    assert moved != key and not compile_cache.is_warm(tmp_path, moved)


def test_cache_folder_comes_from_the_key_then_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(tmp_path / "env"))
    assert compile_cache.cache_root(str(tmp_path / "key")) == tmp_path / "key"
    assert compile_cache.cache_root("") == tmp_path / "env"
    monkeypatch.delenv(compile_cache.CACHE_ENV)
    assert compile_cache.cache_root("") == Path("~/.cache/fcos_d2").expanduser().resolve()


def test_inductor_folder_follows_ours_but_a_users_own_wins(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert compile_cache.activate_cache(tmp_path / "a") == tmp_path / "a" / "inductor"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "a" / "inductor")
    assert compile_cache.activate_cache(tmp_path / "b") == tmp_path / "b" / "inductor"  # ours
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "users"))
    assert compile_cache.activate_cache(tmp_path / "c") == tmp_path / "users"


def _process(scripts, cache: Path, *argv: str) -> dict:
    """tests/compile_cache_process.py in a process of its own (forked from the scripts
    server, which imported torch and fcos_d2 but never compiled anything)."""
    done = scripts.run("tests/compile_cache_process.py", str(cache), *argv)
    assert done.returncode == 0, done.stderr[-3000:]
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return {**json.loads(result[0][len("RESULT "):]), "log": done.stdout}


def test_a_warm_cache_compiles_nothing_in_the_next_process_and_new_weights_recompile_nothing(
        tmp_path, scripts):
    cold = _process(scripts, tmp_path, "40x52,40x56")
    assert not cold["warm_before"] and cold["misses"] > 0 and cold["hits"] == 0
    # the first size runs as it is; the second in its bucket, cropped back
    assert cold["sizes"] == [[1, 3, 40, 52], [1, 3, 64, 64]]
    assert cold["level_shapes"] == [[[1, 1, 40, 52], [1, 1, 20, 26]],
                                    [[1, 1, 40, 56], [1, 1, 20, 28]]]
    assert "expect about" in cold["log"] and str(tmp_path / "inductor") in cold["log"]
    assert (tmp_path / "compiles.json").is_file()
    warm = _process(scripts, tmp_path, "40x56", "reload")  # its bucket is in the cache
    assert warm["warm_before"] and warm["sizes"] == [[1, 3, 64, 64]]
    assert warm["hits"] > 0 and warm["misses"] == 0
    assert "its last compile at this size" in warm["log"]
    assert "loaded from the cache" in warm["log"]
    # new weights in place: new outputs, bf16-close to eager's, from the same graph
    assert warm["changed"] and warm["error"] < 0.05
    assert warm["new_graphs"] == 0 and warm["misses_after"] == 0
