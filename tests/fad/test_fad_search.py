"""FAD's search on the supernet: parameters kept apart, disjoint splits, NUM_CLASSES from
the data, genotype files, and an exact resume. A tiny supernet (ResNet-18, 32-channel FPN
and edges, 64-px images, 2 images a batch)."""
import json

import pytest
import torch

from fcos_d2.modeling.fad import search as fad_search
from fcos_d2.modeling.fad.genotypes import read_genotype_file
from fcos_d2.modeling.fad.supernet import architecture_parameters, weight_parameters

TINY = ["MODEL.FPN.OUT_CHANNELS", "32", "INPUT.MIN_SIZE_TRAIN", "(64,)",
        "INPUT.MAX_SIZE_TRAIN", "64", "SOLVER.IMS_PER_BATCH", "2", "SOLVER.MAX_ITER", "4",
        "SOLVER.CHECKPOINT_PERIOD", "2", "MODEL.FAD.SEARCH.GENOTYPE_PERIOD", "2",
        "MODEL.FCOS.NUM_CLASSES", "80",  # 80: the search takes the data's 6 instead
        # the search configs' normalizer (the recipe's): a state the resume restores
        "MODEL.FCOS.LOSS_NORMALIZER", "ema", "MODEL.FCOS.LOSS_NORMALIZER_EMA_MOMENTUM", "0.99"]


def tiny_cfg(output, *opts):
    args = fad_search.default_argument_parser().parse_args(
        ["--config-file", "configs/FAD/FAD-tiny-search.yaml", *TINY, "OUTPUT_DIR",
         str(output), *opts])
    return fad_search.setup(args)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """A 4-iteration search run at once."""
    cfg = tiny_cfg(tmp_path_factory.mktemp("fad_straight"))
    search = fad_search.Search(cfg)
    search.logged, line = [], fad_search.loss_line  # the losses each record line averages

    def logging_line(iteration, max_iter, losses, lr):
        search.logged.append(list(losses))
        return line(iteration, max_iter, losses, lr)

    fad_search.loss_line = logging_line
    try:
        search.run()
    finally:
        fad_search.loss_line = line
    # as the run left them (a test below takes one more step)
    search.final_state = {k: v.clone() for k, v in search.model.state_dict().items()}
    search.final_genotypes = search.model.genotypes()
    return cfg, search


def test_num_classes_follow_the_data(straight):
    cfg, search = straight
    assert cfg.MODEL.FCOS.NUM_CLASSES == 6
    assert search.model.head.cls_logits.out_channels == 6


def test_weight_optimizer_holds_no_architecture_weight(straight):
    _, search = straight
    alphas = {id(p) for p in architecture_parameters(search.model)}
    in_weight_optimizer = {id(p) for g in search.weight_optimizer.param_groups
                           for p in g["params"]}
    in_arch_optimizer = {id(p) for g in search.arch_optimizer.param_groups for p in g["params"]}
    assert len(alphas) == 6  # 3 nodes in each tower
    assert not alphas & in_weight_optimizer
    assert in_arch_optimizer == alphas
    assert in_weight_optimizer | alphas == {id(p) for p in search.model.parameters()}
    assert {id(p) for p in weight_parameters(search.model)} == in_weight_optimizer


def test_training_and_architecture_splits_are_disjoint(straight):
    _, search = straight
    train = {d["image_id"] for d in search.train_stream.dicts}
    arch = {d["image_id"] for d in search.arch_stream.dicts}
    assert not train & arch and len(train) + len(arch) == 3000


def test_architecture_step_on_the_supernet_changes_only_architecture_weights(straight):
    _, search = straight
    batch = search.arch_stream.batch(7)
    alphas = {id(p) for p in search.alphas}
    names = {name for name, p in search.model.named_parameters() if id(p) in alphas}
    before = {k: v.clone() for k, v in search.model.state_dict().items()}
    fad_search.architecture_step(search.model, search.weights, search.alphas,
                                 search.arch_optimizer, lambda: search.loss(batch))
    after = search.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == names  # every alpha moved, nothing else (buffers included)


def test_genotypes_written_every_period_and_at_the_end(straight):
    cfg, search = straight
    output = search.output
    box, cls = read_genotype_file(output / "genotype.log")
    assert (box, cls) == search.final_genotypes
    assert read_genotype_file(output / "genotype.yaml") == (box, cls)
    record = json.loads((output / "alphas.json").read_text())
    assert [r["iteration"] for r in record["history"]] == [2, 4]
    assert (output / "alphas.png").stat().st_size > 0


def test_each_record_logs_the_mean_loss_of_its_period():
    line = fad_search.loss_line(50, 200, [0.5, 1.6, 0.6], 0.004)
    assert line == ("iteration 50/200: mean loss 0.9000 over the last 3 iterations (the last "
                    "batch 0.6000), lr 0.00400")


def test_the_run_averages_each_period_afresh(straight):
    _, search = straight  # 4 iterations, a record every 2
    assert [len(losses) for losses in search.logged] == [2, 2]
    assert all(loss > 0 for losses in search.logged for loss in losses)


def test_search_resumes_exactly(straight, tmp_path):
    _, done = straight
    cfg = tiny_cfg(tmp_path)
    interrupted = fad_search.Search(cfg)
    for iteration in range(2):
        interrupted.step(iteration)
    interrupted.record(2)
    interrupted.save(2)
    resumed = fad_search.Search(cfg)
    assert resumed.resume() and resumed.start_iter == 2
    resumed.run()
    final, expected = resumed.model.state_dict(), done.final_state
    assert final.keys() == expected.keys()
    for key in expected:
        assert torch.equal(final[key], expected[key]), key
    assert resumed.history == done.history


def test_second_order_step_on_the_supernet_changes_only_architecture_weights(straight):
    _, search = straight
    train, arch = search.train_stream.batch(8), search.arch_stream.batch(8)
    alphas = {id(p) for p in search.alphas}
    names = {name for name, p in search.model.named_parameters() if id(p) in alphas}
    before = {k: v.clone() for k, v in search.model.state_dict().items()}
    fad_search.architecture_step(search.model, search.weights, search.alphas,
                                 search.arch_optimizer, lambda: search.loss(arch),
                                 second_order=True, train_loss=lambda: search.loss(train),
                                 weight_optimizer=search.weight_optimizer, lr=0.004)
    after = search.model.state_dict()
    assert {k for k in before if not torch.equal(before[k], after[k])} == names


def test_the_r50_search_trains_biases_at_twice_the_lr_without_decay_and_clips_at_20(tmp_path):
    from detectron2.config import get_cfg
    from torch import nn

    from fcos_d2 import add_fcos_config

    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file("configs/FAD/FAD-R50-search.yaml")
    assert cfg.SOLVER.CLIP_GRADIENTS.CLIP_VALUE == 20.0
    model = nn.Sequential(nn.Conv2d(1, 2, 1), nn.GroupNorm(1, 2))
    groups = fad_search.weight_groups(model, list(model.parameters()), cfg.SOLVER)
    names = {id(p): n for n, p in model.named_parameters()}
    assert [[names[id(p)] for p in g["params"]] for g in groups] == [["0.weight", "1.weight"],
                                                                      ["0.bias", "1.bias"]]
    assert [(g["lr"], g["weight_decay"]) for g in groups] == [(0.004, 1e-4), (0.008, 0.0)]
    tiny = tiny_cfg(tmp_path)
    (group,) = fad_search.weight_groups(model, [model[0].bias], tiny.SOLVER)
    assert (group["lr"], group["weight_decay"]) == (0.004, 1e-4)  # the tiny search: DARTS's


def test_the_search_starts_from_model_weights_then_a_trained_bottom_up(tmp_path):
    from detectron2.modeling import build_model

    # MODEL.WEIGHTS: a whole supernet of another seed; BOTTOM_UP_WEIGHTS: a trained
    # detector (FCOS on the same trunk) whose bottom-up then replaces the supernet's
    cfg = tiny_cfg(tmp_path / "a")
    torch.manual_seed(123)
    start = build_model(cfg)
    torch.save({"model": start.state_dict()}, tmp_path / "start.pth")
    fcos_cfg = cfg.clone()
    fcos_cfg.defrost()
    fcos_cfg.MODEL.META_ARCHITECTURE = "FCOS"
    trained = build_model(fcos_cfg)
    with torch.no_grad():
        for tensor in trained.backbone.bottom_up.state_dict().values():
            if tensor.is_floating_point():
                tensor.uniform_(0.5, 1.5)
    torch.save({"model": trained.state_dict()}, tmp_path / "trained.pth")
    search = fad_search.Search(tiny_cfg(
        tmp_path / "b", "MODEL.WEIGHTS", str(tmp_path / "start.pth"),
        "MODEL.FAD.SEARCH.BOTTOM_UP_WEIGHTS", str(tmp_path / "trained.pth")))
    got = search.model.state_dict()
    bottom_up = {f"backbone.bottom_up.{k}": v
                 for k, v in trained.backbone.bottom_up.state_dict().items()}
    for key, value in start.state_dict().items():
        expected = bottom_up.get(key, value)
        torch.testing.assert_close(got[key], expected, rtol=0, atol=0, msg=key)
    assert len(bottom_up) > 20 and all(k in got for k in bottom_up)
