"""Official weights in one step: MODEL.WEIGHTS takes an official FCOS or AdelaiDet checkpoint
as published (file, URL or fcos-d2://NAME), recognised by its keys and converted in memory.

The "published" files are generated here from a small fcos-d2 model, renamed to the official
(fcos_core) or AdelaiDet layout, and served by a local HTTP server on 127.0.0.1."""
import hashlib
import logging
import re
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config, model_zoo
from fcos_d2.checkpoint import ChecksumMismatchError, CheckpointMismatchError, FCOSCheckpointer
from fcos_d2.checkpoint.layouts import checkpoint_layout
from test_weights_download import server  # noqa: F401  (the local HTTP server fixture)

REPO = Path(__file__).resolve().parents[2]

# fcos-d2 name -> official (fcos_core) name: the inverse of fcos_d2/checkpoint/official.py
_TO_OFFICIAL = [
    (r"^backbone\.bottom_up\.stem\.conv1\.norm\.", "backbone.body.stem.bn1."),
    (r"^backbone\.bottom_up\.stem\.", "backbone.body.stem."),
    (r"^backbone\.bottom_up\.res(\d)\.(\d+)\.conv(\d)\.norm\.",
     lambda m: f"backbone.body.layer{int(m[1]) - 1}.{m[2]}.bn{m[3]}."),
    (r"^backbone\.bottom_up\.res(\d)\.(\d+)\.shortcut\.norm\.",
     lambda m: f"backbone.body.layer{int(m[1]) - 1}.{m[2]}.downsample.1."),
    (r"^backbone\.bottom_up\.res(\d)\.(\d+)\.shortcut\.",
     lambda m: f"backbone.body.layer{int(m[1]) - 1}.{m[2]}.downsample.0."),
    (r"^backbone\.bottom_up\.res(\d)\.", lambda m: f"backbone.body.layer{int(m[1]) - 1}."),
    (r"^backbone\.fpn_lateral(\d)\.", lambda m: f"backbone.fpn.fpn_inner{int(m[1]) - 1}."),
    (r"^backbone\.fpn_output(\d)\.", lambda m: f"backbone.fpn.fpn_layer{int(m[1]) - 1}."),
    (r"^head\.", "rpn.head."),
]


def small_model() -> torch.nn.Module:
    """The quickstart FCOS (ResNet-18, BN, P3-P4), with random weights."""
    return build_model(zoo_config("quickstart.yaml"))


@pytest.fixture(scope="module")
def expected():
    """The weights the published files hold: a small model's, in fcos-d2's names."""
    torch.manual_seed(0)
    return small_model().state_dict()


def zoo_config(config_file: str):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / config_file))
    cfg.MODEL.DEVICE = "cpu"
    return cfg


def official_layout(state_dict):
    """The model's weights as the official FCOS saves them: fcos_core names, no BN counters,
    and frozen-BN variances without detectron2's epsilon (the converter lowers them by 1e-5)."""
    renamed = {}
    for key, value in state_dict.items():
        if key.endswith("num_batches_tracked"):
            continue
        for pattern, replacement in _TO_OFFICIAL:
            key, hits = re.subn(pattern, replacement, key)
            if hits:
                break
        renamed["module." + key] = value + 1e-5 if key.endswith("running_var") else value
    return renamed


def adelaidet_layout(state_dict):
    """As AdelaiDet's OneStageDetector names FCOS: the head under proposal_generator."""
    return {re.sub(r"^head\.", "proposal_generator.fcos_head.", key).replace(
        "centerness", "ctrness"): value for key, value in state_dict.items()}


def assert_same_weights(model, expected):
    """Equal tensors; BN variances within float rounding of the +-1e-5 round trip."""
    state = model.state_dict()
    for key, value in expected.items():
        same = torch.equal(state[key], value) or (
            key.endswith("running_var") and float((state[key] - value).abs().max()) < 1e-6)
        assert same, key


@pytest.fixture
def log_lines():
    """Messages of fvcore's checkpointer logger (FCOSCheckpointer logs through it)."""
    lines, handler = [], logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("fvcore.common.checkpoint")
    level = logger.level
    logger.setLevel(logging.INFO)  # setLevel, not .level =: it clears the enabled-for cache
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_layouts_are_recognised_by_their_keys():
    assert checkpoint_layout(["backbone.body.stem.conv1.weight"]) == "official"
    assert checkpoint_layout(["module.rpn.head.cls_logits.bias"]) == "official"
    assert checkpoint_layout(["proposal_generator.fcos_head.ctrness.bias"]) == "adelaidet"
    assert checkpoint_layout(["backbone.bottom_up.stem.conv1.weight", "head.cls_logits.bias"]) \
        == "fcos_d2"


def test_an_official_checkpoint_url_loads_as_published_with_a_log_line(server, tmp_path,
                                                                        log_lines, expected):
    base, folder, _ = server
    torch.save({"model": official_layout(expected), "optimizer": {}, "iteration": 89999},
               folder / "FCOS_imprv_R_50_FPN_1x.pth")
    model = small_model()
    url = f"{base}/FCOS_imprv_R_50_FPN_1x.pth"
    loaded = FCOSCheckpointer(model, cache_dir=str(tmp_path / "cache")).load(url)
    assert_same_weights(model, expected)
    assert "iteration" not in loaded  # the official run's iteration is not ours
    assert any(line.startswith(f"{url} is an official FCOS (fcos_core) checkpoint: converted "
                               "to fcos-d2's names in memory") for line in log_lines), log_lines


def test_an_adelaidet_checkpoint_file_loads_as_published(tmp_path, log_lines, expected):
    path = tmp_path / "FCOS_MS_R_50_2x.pth"
    torch.save({"model": adelaidet_layout(expected)}, path)
    model = small_model()
    FCOSCheckpointer(model).load(str(path))
    assert_same_weights(model, expected)
    assert any("is an AdelaiDet FCOS checkpoint" in line for line in log_lines)


def test_an_official_checkpoint_with_a_key_without_fcos_d2_name_is_refused_naming_it(
        tmp_path, expected):
    weights = official_layout(expected)
    weights["rpn.head.mask_logits.weight"] = torch.ones(1)
    path = tmp_path / "official.pth"
    torch.save({"model": weights}, path)
    with pytest.raises(CheckpointMismatchError, match=rf"MODEL.WEIGHTS {path}: 1 keys of the "
                                                      r"official checkpoint .*mask_logits"):
        FCOSCheckpointer(small_model()).load(str(path))
    del weights["rpn.head.mask_logits.weight"], weights["module.rpn.head.centerness.bias"]
    torch.save({"model": weights}, path)  # a parameter of the model left unfilled
    with pytest.raises(CheckpointMismatchError, match=r"missing \(1\): head.centerness.bias"):
        FCOSCheckpointer(small_model()).load(str(path))


def test_every_model_of_the_readme_configs_table_is_in_the_zoo_with_its_published_url():
    readme = (REPO / "README.md").read_text()
    table = re.findall(r"^\| `configs/([\w.-]+)\.yaml` \| (\w+)", readme, flags=re.M)
    fcos_models = sorted(name for name, entry in model_zoo.MODELS.items()
                         if entry.published_by in ("FCOS", "AdelaiDet"))  # members add theirs
    assert len(table) == 7 and sorted(name for name, _ in table) == fcos_models
    for name, official in table:
        assert model_zoo.resolve_name(official) == name
        assert model_zoo.get_checkpoint_url(name).startswith("https://cloudstor.aarnet.edu.au/")
        assert Path(model_zoo.get_config_file(name)).name == f"{name}.yaml"
    assert model_zoo.resolve_name("fcos-d2://FCOS-R50.yaml") == "FCOS-R50"
    with pytest.raises(KeyError, match="no model 'FCOS-R18'; the models are FCOS-R50, "):
        model_zoo.get_checkpoint_url("FCOS-R18")


def test_a_zoo_name_downloads_once_records_the_hash_and_refuses_another_file(
        server, tmp_path, monkeypatch, expected):
    base, folder, requests = server
    monkeypatch.setenv("FCOS_D2_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(model_zoo.MODELS, "FCOS-R50", model_zoo.MODELS["FCOS-R50"]._replace(
        config="quickstart.yaml", url=f"{base}/s/ZSAqNJB96hA71Yf/download"))
    (folder / "s" / "ZSAqNJB96hA71Yf").mkdir(parents=True)
    served = folder / "s" / "ZSAqNJB96hA71Yf" / "download"
    torch.save({"model": official_layout(expected)}, served)

    model = model_zoo.get("FCOS-R50", trained=True, device="cpu")
    assert_same_weights(model, expected)
    [record] = (tmp_path / "cache").rglob("download.sha256")
    assert record.read_text().strip() == hashlib.sha256(served.read_bytes()).hexdigest()

    cfg = model_zoo.get_config("FCOS-R50", trained=True)  # the same file, from the cache
    assert cfg.MODEL.WEIGHTS == "fcos-d2://FCOS-R50"
    FCOSCheckpointer.from_config(cfg, model).load(cfg.MODEL.WEIGHTS)
    assert requests == ["/s/ZSAqNJB96hA71Yf/download"]

    torch.save({"model": official_layout(expected), "republished": True}, served)
    Path(str(record)[:-len(".sha256")]).unlink()  # e.g. a cache cleaned by hand
    with pytest.raises(ChecksumMismatchError, match="recorded at its first download"):
        FCOSCheckpointer.from_config(cfg, model).load(cfg.MODEL.WEIGHTS)
