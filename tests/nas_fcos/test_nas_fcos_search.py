"""The NAS-FCOS search: the controller samples valid genotypes only, PPO moves it towards
rewarded choices, and a two-step search on a tiny set writes a config that builds and
resumes where it stopped."""
import json

import torch
from detectron2.config import get_cfg
from detectron2.data.datasets import register_coco_instances
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config
from fcos_d2.modeling.nas_fcos.genotypes import HEAD_OPS, NUM_INPUTS
from fcos_d2.modeling.nas_fcos.search import (PPO, Controller, fpn_decisions, fpn_from_actions,
                                              head_decisions, head_from_actions, sample_uniform,
                                              sample_valid)
from fcos_d2.modeling.nas_fcos.search.__main__ import main


def test_the_controller_and_the_uniform_sampler_give_valid_genotypes_only():
    controller = Controller(*fpn_decisions(7))
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        for actions, genotype in (sample_valid(controller, fpn_from_actions, generator)[:2],
                                  sample_uniform(controller.limits, fpn_from_actions, generator)):
            assert len(genotype.unused()) >= 3
            assert all(i < NUM_INPUTS + c for c, cell in enumerate(genotype.cells)
                       for i in cell.inputs)
            assert fpn_from_actions(actions) == genotype


def test_ppo_makes_a_rewarded_choice_more_likely():
    torch.manual_seed(0)
    controller = Controller(*head_decisions(1))
    ppo = PPO(controller, lr=0.01)
    generator = torch.Generator().manual_seed(0)

    def probability_of_conv1x1():
        with torch.no_grad():
            return sum(controller.run([share, 0])[1].exp().item() for share in (0, 1))

    before = probability_of_conv1x1()
    for _ in range(40):
        actions, genotype, log_prob = sample_valid(controller, head_from_actions, generator)
        ppo.update(actions, log_prob, reward=1.0 if genotype.ops[0] == HEAD_OPS[0] else 0.0)
    assert probability_of_conv1x1() > before + 0.1, (before, probability_of_conv1x1())


def test_a_two_step_search_writes_a_config_that_builds_and_resumes(dataset, tmp_path):
    register_coco_instances("nas_search_tiny", {}, str(dataset / "annotations.json"),
                            str(dataset / "images"))
    argv = ["--dataset", "nas_search_tiny", "--train-images", "2", "--val-images", "2",
            "--head-samples", "2", "--proxy-iterations", "1", "--batch-size", "2",
            "--num-cells", "3", "--head-layers", "2", "--output", str(tmp_path)]
    opts = ["MODEL.NAS_FCOS.CHANNELS", "32"]  # config overrides come last
    path = main(argv + ["--fpn-samples", "2"] + opts)
    records = json.loads((tmp_path / "search_records.json").read_text())
    assert [(r["phase"], r["sample"]) for r in records] == [("fpn", 0), ("fpn", 1),
                                                             ("head", 0), ("head", 1)]
    assert all(r["reward"] < 0 for r in records)  # minus a sum of losses
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(path))
    cfg.MODEL.DEVICE = "cpu"
    best_fpn = max(records[:2], key=lambda r: r["reward"])["genotype"]["FPN_GENOTYPE"]
    assert cfg.MODEL.NAS_FCOS.FPN_GENOTYPE == best_fpn
    model = build_model(cfg).eval()
    assert len(model.backbone.cells) == 3
    with torch.no_grad():
        model([{"image": torch.zeros(3, 64, 64)}])
    main(argv + ["--fpn-samples", "3", "--resume"] + opts)  # one more FPN sample, nothing else
    records = json.loads((tmp_path / "search_records.json").read_text())
    assert [(r["phase"], r["sample"]) for r in records][-1] == ("fpn", 2)
    assert len(records) == 5
