"""The search on a trained bottom-up: ``--bottom-up-weights`` loads a trained detector's
``backbone.bottom_up.*`` (here an FCOS of the recipe config, as the recipe's own
checkpoint) into the proxy's fixed bottom-up (configs/NAS-FCOS/search_on_recipe.yaml),
every tensor; a checkpoint that does not fit is refused naming what differs."""
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.data.datasets import register_coco_instances
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config, get_config_file
from fcos_d2.checkpoint.parts import load_bottom_up
from fcos_d2.modeling.nas_fcos.search.proxy import ProxyTask, load_inputs


def _cfg(config: str):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(get_config_file(config))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu"])
    return cfg


@pytest.fixture(scope="module")
def trained_fcos(tmp_path_factory):
    """An FCOS of the recipe config with distinct weights and BN statistics, saved as
    train_net.py saves a checkpoint ({"model": state dict, ...})."""
    torch.manual_seed(7)
    model = build_model(_cfg("FCOS-R18-small-data-P3-P7.yaml"))  # a trunk up to res5
    with torch.no_grad():
        for tensor in model.backbone.bottom_up.state_dict().values():
            if tensor.is_floating_point():
                tensor.uniform_(0.5, 1.5)  # unlike any initialisation
    path = tmp_path_factory.mktemp("trained") / "model_final.pth"
    torch.save({"model": model.state_dict(), "iteration": 10}, path)
    return model, path


def test_the_proxy_task_takes_every_bottom_up_tensor_of_the_trained_checkpoint(
        trained_fcos, dataset):
    model, path = trained_fcos
    register_coco_instances("nas_trained_tiny", {}, str(dataset / "annotations.json"),
                            str(dataset / "images"))
    cfg = _cfg("NAS-FCOS/search_on_recipe.yaml")
    cfg.merge_from_list(["MODEL.NAS_FCOS.CHANNELS", 32])
    inputs = load_inputs(cfg, "nas_trained_tiny", 0, 2)
    proxy = ProxyTask(cfg, inputs[:1], inputs[1:], iterations=1, batch_size=1, lr=1e-3,
                      bottom_up_weights=str(path))
    expected = model.backbone.bottom_up.state_dict()
    got = proxy.bottom_up.state_dict()
    assert got.keys() == expected.keys() and len(got) > 50
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=key)
    untrained = ProxyTask(cfg, inputs[:1], inputs[1:], iterations=1, batch_size=1, lr=1e-3)
    features = proxy.train[0][0]["res5"]
    assert not torch.allclose(features, untrained.train[0][0]["res5"])  # cached from it


def test_a_checkpoint_that_does_not_fit_is_refused_naming_the_keys(trained_fcos, tmp_path):
    model, _ = trained_fcos
    state = {k: v for k, v in model.state_dict().items() if "res5.1" not in k}
    torch.save(state, tmp_path / "partial.pth")  # a bare state dict is read too
    target = build_model(_cfg("NAS-FCOS/search_on_recipe.yaml")).backbone.bottom_up
    with pytest.raises(ValueError, match=r"partial.pth: its bottom-up does not fit.*"
                                         r"missing \['res5.1"):
        load_bottom_up(target, str(tmp_path / "partial.pth"))
    torch.save({"head.x": torch.zeros(1)}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match=r"other.pth: no 'backbone.bottom_up.\*' entries"):
        load_bottom_up(target, str(tmp_path / "other.pth"))


def test_the_proxy_moves_the_dcn_offsets_at_its_factor_of_the_lr(dataset, monkeypatch):
    from fcos_d2.modeling.layers import DeformConv2d
    from fcos_d2.modeling.nas_fcos.genotypes import PUBLISHED_FPN, PUBLISHED_HEAD

    register_coco_instances("nas_offsets_tiny", {}, str(dataset / "annotations.json"),
                            str(dataset / "images"))
    cfg = _cfg("NAS-FCOS/search_on_recipe.yaml")
    assert cfg.SOLVER.DEFORM_OFFSET_LR_FACTOR == 0.1  # as the designed rows train
    cfg.merge_from_list(["MODEL.NAS_FCOS.CHANNELS", 32])
    inputs = load_inputs(cfg, "nas_offsets_tiny", 0, 4)  # batches of 2: BN on P7's 1x1 map
    proxy = ProxyTask(cfg, inputs[:2], inputs[2:], iterations=2, batch_size=2, lr=1e-2,
                      offset_lr_factor=0.0)  # frozen offsets: they must not move
    built = []
    build = proxy.build_decoder
    monkeypatch.setattr(proxy, "build_decoder", lambda *a: built.append(build(*a)) or built[-1])
    proxy.reward(PUBLISHED_FPN, PUBLISHED_HEAD)
    convs = [m for m in built[0].modules() if isinstance(m, DeformConv2d)]
    assert len(convs) == 16
    assert all(not m.offset.weight.any() and not m.offset.bias.any() for m in convs)
    assert any(m.weight.grad is not None and m.weight.grad.any() for m in convs)
    proxy.offset_lr_factor = 1.0  # at the lr they do move
    proxy.reward(PUBLISHED_FPN, PUBLISHED_HEAD)
    assert any(m.offset.weight.any() for m in built[1].modules() if isinstance(m, DeformConv2d))
