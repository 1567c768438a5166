"""Schedules in epochs (fcos_d2/engine/schedule.py): the derived iteration keys, the units a
config's layers choose, the count of training images as the loader sees them, and the check
of the derived schedule on resume."""
import pytest
from detectron2.config import LazyConfig, get_cfg, instantiate
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.structures import BoxMode

from fcos_d2.config import add_fcos_config, get_config_file
from fcos_d2.engine.schedule import (ScheduleOnResume, apply_epoch_schedule,
                                     apply_lazy_epoch_schedule, choose_units, config_layers,
                                     derive_schedule, iterations_for_epochs, schedule_record)


def test_iterations_round_up_to_the_first_iteration_that_completes_the_epochs():
    assert iterations_for_epochs(1, 400, 4) == 100  # 400 images, 4 per iteration
    assert iterations_for_epochs(1, 401, 4) == 101  # 100.25 -> 101
    assert iterations_for_epochs(0.1, 400, 4) == 10  # exactly 10, not 10.000000000000002
    assert iterations_for_epochs(2.5, 10, 4) == 7  # 25 images / 4 = 6.25 -> 7


def test_every_epoch_key_derives_its_iteration_key_for_the_total_batch():
    # 403 images, batch 8 in total: 50.375 iterations per epoch.
    schedule = derive_schedule(
        {"SOLVER.EPOCHS": 24, "SOLVER.STEPS_EPOCHS": (16, 22), "SOLVER.WARMUP_EPOCHS": 0.5,
         "SOLVER.CHECKPOINT_PERIOD_EPOCHS": 4, "TEST.EVAL_PERIOD_EPOCHS": 2},
        num_images=403, total_batch=8, num_workers=2)
    assert schedule.iterations == {
        "SOLVER.MAX_ITER": 1209,  # 24 * 403 / 8 = 1209 exactly
        "SOLVER.STEPS": (806, 1109),  # 806 exactly; 1108.25 -> 1109
        "SOLVER.WARMUP_ITERS": 26,  # 25.1875 -> 26
        "SOLVER.CHECKPOINT_PERIOD": 202,  # 201.5 -> 202
        "TEST.EVAL_PERIOD": 101,  # 100.75 -> 101
    }
    line = schedule.describe()
    assert "403 training images" in line and "4 per worker x 2" in line
    assert "403/8 iterations per epoch" in line
    assert "SOLVER.EPOCHS 24 -> SOLVER.MAX_ITER 1209" in line


def test_the_worker_count_does_not_change_the_schedule_but_must_divide_the_batch():
    epochs = {"SOLVER.EPOCHS": 12, "SOLVER.STEPS_EPOCHS": (), "TEST.EVAL_PERIOD_EPOCHS": 0}
    one = derive_schedule(epochs, num_images=100, total_batch=16, num_workers=1)
    eight = derive_schedule(epochs, num_images=100, total_batch=16, num_workers=8)
    assert one.iterations == eight.iterations == {"SOLVER.MAX_ITER": 75}  # 1200 / 16
    with pytest.raises(ValueError, match=r"total_batch_size\) 16 is not a positive multiple "
                                         "of the 3 workers"):
        derive_schedule(epochs, num_images=100, total_batch=16, num_workers=3)


def test_an_empty_training_set_or_negative_epochs_are_refused():
    with pytest.raises(ValueError, match="has no images after filtering"):
        derive_schedule({"SOLVER.EPOCHS": 1}, num_images=0, total_batch=2)
    with pytest.raises(ValueError, match=r"SOLVER.STEPS_EPOCHS \(3, -1\): epochs cannot be"):
        derive_schedule({"SOLVER.STEPS_EPOCHS": (3, -1)}, num_images=4, total_batch=2)


def test_the_last_layer_that_sets_a_setting_chooses_its_unit():
    chosen = choose_units([
        ("base", {"SOLVER.MAX_ITER", "SOLVER.STEPS", "TEST.EVAL_PERIOD"}),
        ("file", {"SOLVER.EPOCHS", "SOLVER.STEPS_EPOCHS"}),
        ("the command line", {"SOLVER.STEPS", "SOLVER.BASE_LR"}),
    ])
    assert chosen == {"SOLVER.MAX_ITER": "SOLVER.EPOCHS", "SOLVER.STEPS": "SOLVER.STEPS",
                      "SOLVER.WARMUP_ITERS": "SOLVER.WARMUP_ITERS",
                      "SOLVER.CHECKPOINT_PERIOD": "SOLVER.CHECKPOINT_PERIOD",
                      "TEST.EVAL_PERIOD": "TEST.EVAL_PERIOD"}


def test_one_layer_setting_a_key_in_both_units_is_an_error_naming_both():
    with pytest.raises(ValueError, match="the command line sets both TEST.EVAL_PERIOD and "
                                         "TEST.EVAL_PERIOD_EPOCHS"):
        choose_units([("the command line", {"TEST.EVAL_PERIOD", "TEST.EVAL_PERIOD_EPOCHS"})])


def test_config_layers_follow_the_base_files_then_the_file_then_the_command_line(tmp_path):
    (tmp_path / "base.yaml").write_text("SOLVER:\n  MAX_ITER: 90000\n  STEPS: (60000,)\n")
    (tmp_path / "recipe.yaml").write_text('_BASE_: "base.yaml"\nSOLVER:\n  EPOCHS: 12\n'
                                          "TEST:\n  EVAL_PERIOD_EPOCHS: 1\n")
    layers = config_layers(str(tmp_path / "recipe.yaml"), ["SOLVER.STEPS_EPOCHS", "(8,)"])
    assert [keys for _, keys in layers] == [{"SOLVER.MAX_ITER", "SOLVER.STEPS"},
                                            {"SOLVER.EPOCHS", "TEST.EVAL_PERIOD_EPOCHS"},
                                            {"SOLVER.STEPS_EPOCHS"}]
    assert layers[0][0] == f"config file {tmp_path / 'base.yaml'}"


@pytest.fixture
def five_images_one_unusable():
    """'epochs_toy': 5 images; one has no annotation, one only a zero-width box (dropped by
    fcos_d2.data.boxes, so it has none left either): the loader sees 3."""
    def image(index, boxes):
        return {"file_name": f"{index}.png", "image_id": index, "height": 32, "width": 32,
                "annotations": [{"bbox": box, "bbox_mode": BoxMode.XYWH_ABS, "category_id": 0,
                                 "iscrowd": 0} for box in boxes]}

    name = "epochs_toy"
    DatasetCatalog.register(name, lambda: [image(0, [[1, 1, 8, 8]]), image(1, []),
                                           image(2, [[4, 4, 0, 9]]), image(3, [[2, 2, 5, 5]]),
                                           image(4, [[0, 0, 9, 9]])])
    MetadataCatalog.get(name).thing_classes = ["thing"]
    yield name
    DatasetCatalog.remove(name)
    MetadataCatalog.remove(name)


def _config(dataset: str):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.DATASETS.TRAIN = (dataset,)
    cfg.SOLVER.IMS_PER_BATCH = 2
    return cfg


def test_apply_counts_the_images_the_loader_sees_and_resets_the_losing_epoch_keys(
        five_images_one_unusable):
    cfg = _config(five_images_one_unusable)
    cfg.SOLVER.EPOCHS, cfg.SOLVER.WARMUP_EPOCHS, cfg.TEST.EVAL_PERIOD_EPOCHS = 4, 0.5, 2
    layers = [("file", {"SOLVER.EPOCHS", "SOLVER.WARMUP_EPOCHS", "TEST.EVAL_PERIOD_EPOCHS"}),
              ("the command line", {"TEST.EVAL_PERIOD"})]
    cfg.TEST.EVAL_PERIOD = 5
    schedule = apply_epoch_schedule(cfg, layers, num_workers=1)
    assert schedule.num_images == 3  # 5 images - 1 empty - 1 whose only box is invalid
    # MAX_ITER 4 * 3 / 2 = 6; WARMUP_ITERS 0.5 * 3 / 2 = 0.75 -> 1
    assert (cfg.SOLVER.MAX_ITER, cfg.SOLVER.WARMUP_ITERS) == (6, 1)
    assert (cfg.TEST.EVAL_PERIOD, cfg.TEST.EVAL_PERIOD_EPOCHS) == (5, 0)  # iterations won
    cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS = False  # detectron2 keeps the empty images
    assert apply_epoch_schedule(cfg, layers, num_workers=1).num_images == 5


def test_without_an_epoch_key_nothing_is_derived_or_loaded():
    cfg = _config("not_registered")  # would raise if it were loaded
    assert apply_epoch_schedule(cfg, [("file", {"SOLVER.MAX_ITER"})], num_workers=1) is None
    assert cfg.SOLVER.MAX_ITER == get_cfg().SOLVER.MAX_ITER


def test_resume_accepts_the_same_derived_schedule_and_refuses_another_naming_both(
        five_images_one_unusable):
    cfg = _config(five_images_one_unusable)
    cfg.SOLVER.EPOCHS = 4
    apply_epoch_schedule(cfg, [("file", {"SOLVER.EPOCHS"})], num_workers=1)
    saved = ScheduleOnResume(schedule_record(cfg)).state_dict()
    assert saved["SOLVER.MAX_ITER"] == 6 and saved["SOLVER.EPOCHS"] == 4
    ScheduleOnResume(schedule_record(cfg)).load_state_dict(saved)  # the same: accepted
    cfg.SOLVER.IMS_PER_BATCH = 3
    apply_epoch_schedule(cfg, [("file", {"SOLVER.EPOCHS"})], num_workers=1)  # 12 / 3 = 4
    with pytest.raises(ValueError, match=r"derived from epochs as SOLVER.MAX_ITER 6, "
                                         r"SOLVER.IMS_PER_BATCH 2, but this run derives "
                                         r"SOLVER.MAX_ITER 4, SOLVER.IMS_PER_BATCH 3"):
        ScheduleOnResume(schedule_record(cfg)).load_state_dict(saved)


def test_resume_of_an_iteration_schedule_may_change_it():
    cfg = get_cfg()
    add_fcos_config(cfg)
    saved = schedule_record(cfg)
    cfg.SOLVER.MAX_ITER *= 2  # training longer than planned: not derived, not refused
    assert schedule_record(cfg)["SOLVER.MAX_ITER"] == 2 * saved["SOLVER.MAX_ITER"]
    ScheduleOnResume(schedule_record(cfg)).load_state_dict(saved)


def _lazy(overrides):
    path = get_config_file("lazy/quickstart.py")
    return path, LazyConfig.apply_overrides(LazyConfig.load(path), overrides)


def test_the_lazy_config_derives_max_iter_milestones_warmup_and_periods(
        five_images_one_unusable):
    overrides = [f"dataloader.train.dataset.names={five_images_one_unusable}",
                 "dataloader.train.total_batch_size=2", "train.epochs=4",
                 "train.steps_epochs=[2, 3]", "train.warmup_epochs=0.5",
                 "train.eval_period_epochs=1"]
    path, cfg = _lazy(overrides)
    schedule = apply_lazy_epoch_schedule(cfg, path, overrides, num_workers=1)
    # its loader keeps every image (filter_empty=False, no box filtering): 5 per epoch
    assert schedule.num_images == 5
    assert (cfg.train.max_iter, list(cfg.lr_multiplier.scheduler.milestones)) == (10, [5, 8])
    assert cfg.lr_multiplier.scheduler.num_updates == 10  # milestones in iterations
    assert cfg.lr_multiplier.warmup_length == 2 / 10  # 0.5 * 5 / 2 = 1.25 -> 2 iterations
    assert (cfg.train.eval_period, cfg.train.checkpointer.period) == (3, 800)  # 2.5 -> 3; kept
    multiplier = instantiate(cfg.lr_multiplier)
    assert [multiplier(it / 10) for it in (4, 5, 7, 8)] == [1.0, 0.1, 0.1, 0.01]


def test_the_lazy_command_line_setting_both_units_is_refused_naming_both():
    overrides = ["train.epochs=2", "train.max_iter=5"]
    path, cfg = _lazy(overrides)
    with pytest.raises(ValueError, match="the command line sets both train.max_iter and "
                                         "train.epochs"):
        apply_lazy_epoch_schedule(cfg, path, overrides, num_workers=1)
