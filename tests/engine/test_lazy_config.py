"""The LazyConfigs (configs/lazy/*.py) build what their YAML twins build: the same modules,
parameters, hyper-parameters, outputs, optimizer, schedule and data pipeline; and
tools/lazyconfig_train_net.py trains and evaluates one."""
import importlib.util
import json
import uuid
from pathlib import Path

import pytest
import torch
from detectron2.config import LazyConfig, get_cfg, instantiate
from detectron2.data import DatasetMapper
from detectron2.modeling import build_model
from detectron2.solver import build_lr_scheduler

from fcos_d2 import add_fcos_config, get_config_file
from fcos_d2.data import register_coco_dataset, synthetic
from fcos_d2.engine.optimizer import build_optimizer

REPO = Path(__file__).resolve().parents[2]
TWINS = [("FCOS-R50.yaml", "lazy/fcos_R_50_FPN_1x.py"), ("quickstart.yaml", "lazy/quickstart.py")]
PRIMITIVES = (bool, int, float, str, type(None))


def yaml_cfg(name: str):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(get_config_file(name))
    cfg.MODEL.DEVICE = "cpu"
    return cfg


def models(yaml_name: str, lazy_name: str):
    """(model from the YAML config, model from the LazyConfig), in eval mode, built from
    different seeds so that equal outputs can only come from equal modules."""
    torch.manual_seed(0)
    from_yaml = build_model(yaml_cfg(yaml_name)).eval()
    torch.manual_seed(1)
    from_lazy = instantiate(LazyConfig.load(get_config_file(lazy_name)).model).eval()
    return from_yaml, from_lazy


def plain_attributes(obj) -> dict:
    """The public attributes of ``obj`` that are numbers, strings or lists of them."""
    plain = lambda v: isinstance(v, PRIMITIVES) or (
        isinstance(v, (list, tuple)) and all(isinstance(x, PRIMITIVES + (list, tuple)) for x in v))
    return {k: v for k, v in vars(obj).items() if not k.startswith("_") and plain(v)}


def settings(model: torch.nn.Module):
    """Every module's plain attributes (strides, thresholds, stage names, ...) by module name."""
    return {name: plain_attributes(m) for name, m in model.named_modules()}


def augmentations(mapper: DatasetMapper):
    """Type and settings of each augmentation (a LazyConfig turns tuples into lists)."""
    as_tuple = lambda v: tuple(v) if isinstance(v, (list, tuple)) else v
    return [(type(a).__name__, {k: as_tuple(v) for k, v in vars(a).items() if k[0] != "_"})
            for a in mapper.augmentations.augs]


@pytest.mark.parametrize("yaml_name, lazy_name", TWINS)
def test_lazy_and_yaml_configs_build_the_same_model(yaml_name, lazy_name):
    from_yaml, from_lazy = models(yaml_name, lazy_name)
    assert [(k, v.shape) for k, v in from_lazy.state_dict().items()] == \
        [(k, v.shape) for k, v in from_yaml.state_dict().items()]
    assert [(k, p.requires_grad) for k, p in from_lazy.named_parameters()] == \
        [(k, p.requires_grad) for k, p in from_yaml.named_parameters()]  # same frozen stages
    assert settings(from_lazy) == settings(from_yaml)
    assert repr(from_lazy) == repr(from_yaml)

    weights = from_yaml.state_dict()
    weights["head.cls_logits.bias"].zero_()  # probability 0.5: many detections to compare
    from_yaml.load_state_dict(weights)
    from_lazy.load_state_dict(weights)
    torch.manual_seed(2)
    image = {"image": torch.randint(0, 256, (3, 96, 128), dtype=torch.uint8), "height": 96,
             "width": 128}
    with torch.no_grad():
        expected, actual = from_yaml([image])[0]["instances"], from_lazy([image])[0]["instances"]
    assert len(expected) > 20  # detections worth comparing
    assert torch.equal(actual.pred_boxes.tensor, expected.pred_boxes.tensor)
    assert torch.equal(actual.scores, expected.scores)
    assert torch.equal(actual.pred_classes, expected.pred_classes)


@pytest.mark.parametrize("yaml_name, lazy_name", TWINS)
def test_lazy_config_has_the_yaml_optimizer_schedule_and_data(yaml_name, lazy_name):
    cfg, lazy = yaml_cfg(yaml_name), LazyConfig.load(get_config_file(lazy_name))
    model = instantiate(lazy.model)
    lazy.optimizer.params.model = model
    expected, actual = build_optimizer(cfg, model), instantiate(lazy.optimizer)
    by_param = lambda opt: {id(p): (g["lr"], g["weight_decay"], g.get("momentum"), g.get("betas"))
                            for g in opt.param_groups for p in g["params"]}
    assert type(actual) is type(expected)  # SGD, or AdamW for SOLVER.OPTIMIZER "ADAMW"
    assert by_param(actual) == by_param(expected)

    scheduler, multiplier = build_lr_scheduler(cfg, expected), instantiate(lazy.lr_multiplier)
    max_iter = lazy.train.max_iter
    assert max_iter == cfg.SOLVER.MAX_ITER
    for it in sorted({0, 1, cfg.SOLVER.WARMUP_ITERS - 1, cfg.SOLVER.WARMUP_ITERS, max_iter - 1,
                      *cfg.SOLVER.STEPS, *(s - 1 for s in cfg.SOLVER.STEPS)}):
        scheduler.last_epoch = it
        assert scheduler.get_lr()[0] == pytest.approx(cfg.SOLVER.BASE_LR * multiplier(it / max_iter),
                                                      rel=1e-12), f"iteration {it}"

    for is_train, node in ((True, lazy.dataloader.train), (False, lazy.dataloader.test)):
        assert augmentations(instantiate(node.mapper)) == \
            augmentations(DatasetMapper(cfg, is_train=is_train))
        assert plain_attributes(instantiate(node.mapper)) == \
            plain_attributes(DatasetMapper(cfg, is_train=is_train))
    assert lazy.dataloader.train.dataset.names == cfg.DATASETS.TRAIN[0]
    assert lazy.dataloader.test.dataset.names == cfg.DATASETS.TEST[0]
    assert lazy.dataloader.train.total_batch_size == cfg.SOLVER.IMS_PER_BATCH
    assert (lazy.train.checkpointer.period, lazy.train.eval_period) == \
        (cfg.SOLVER.CHECKPOINT_PERIOD, cfg.TEST.EVAL_PERIOD)
    assert lazy.train.amp.enabled == cfg.SOLVER.AMP.ENABLED
    assert lazy.dataloader.train.num_workers == cfg.DATALOADER.NUM_WORKERS


def _load_train_script():
    spec = importlib.util.spec_from_file_location(
        "lazyconfig_train_net", REPO / "tools" / "lazyconfig_train_net.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lazyconfig_train_net_trains_the_quickstart_config_and_evaluates_it(tmp_path):
    data = tmp_path / "data"
    synthetic.write_split(data, split="val", num_images=4)
    name = f"lazy_tiny_{uuid.uuid4().hex[:8]}"
    register_coco_dataset(name, str(data / "annotations.json"), str(data / "images"))
    script, output = _load_train_script(), tmp_path / "output"
    tiny = [f"dataloader.train.dataset.names={name}", f"dataloader.test.dataset.names={name}",
            "dataloader.train.total_batch_size=2", "dataloader.train.num_workers=0",
            "dataloader.test.num_workers=0", "model.score_thresh=0.0",
            f"train.output_dir={output}", "train.log_period=1"]
    parser = script.default_argument_parser()
    script.main(parser.parse_args(["--config-file", get_config_file("lazy/quickstart.py"),
                                   *tiny, "train.max_iter=2"]))

    metrics = [json.loads(line) for line in (output / "metrics.json").read_text().splitlines()]
    trained = [m for m in metrics if "total_loss" in m]
    assert [m["iteration"] for m in trained] == [0, 1]
    assert all(key in trained[-1] for key in ("loss_fcos_cls", "loss_fcos_loc", "loss_fcos_ctr"))
    final_ap = [m["bbox/AP"] for m in metrics if "bbox/AP" in m]
    assert len(final_ap) == 1  # the evaluation after the last iteration
    assert (output / "model_final.pth").is_file()

    results = script.main(parser.parse_args(
        ["--config-file", get_config_file("lazy/quickstart.py"), "--eval-only", *tiny,
         f"train.init_checkpoint={output / 'model_final.pth'}"]))
    assert results["bbox"]["AP"] == pytest.approx(final_ap[0], abs=1e-9)


def test_get_config_file_finds_configs_from_anywhere_and_names_a_missing_one(tmp_path,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Path(get_config_file("lazy/quickstart.py")) == REPO / "configs/lazy/quickstart.py"
    with pytest.raises(FileNotFoundError, match=r"'FCOS-R51.yaml' not found: no file .*"
                                                r"configs/FCOS-R51.yaml \(the configs are: "
                                                r".*FCOS-R50.yaml, .*lazy/quickstart.py"):
        get_config_file("FCOS-R51.yaml")
