"""benchmarks.train_quality's Faster R-CNN contender: detectron2's GeneralizedRCNN (RPN,
StandardROIHeads) on the recipe's ResNet trunk, the regime's classes, the command's
overrides last, and a run through the protocol that records its iterations."""
import torch
from detectron2.modeling import build_model
from detectron2.modeling.meta_arch import GeneralizedRCNN
from detectron2.modeling.proposal_generator import RPN
from detectron2.modeling.roi_heads import StandardROIHeads

from benchmarks.train_quality import catalog, contenders as cn
from benchmarks.train_quality.results import repository_record

SMALL = ["MODEL.FPN.OUT_CHANNELS", 32, "MODEL.FCOS.NUM_CONVS", 1]


def _trunk_shapes(model) -> dict:
    return {k: tuple(v.shape) for k, v in model.backbone.bottom_up.state_dict().items()}


def test_faster_rcnn_is_generalized_rcnn_on_the_resnet_trunk_it_was_measured_on():
    rcnn_cfg = catalog.contender_cfg(cn.FASTER_RCNN, 0, "unused", SMALL)
    # the recipe before issue 60: its trunk up to res5 (P3-P7) and SGD in float32
    recipe_cfg = catalog.contender_cfg(f"{cn.RECIPE}+p3-p7", 0, "unused", SMALL)
    sgd_cfg = catalog.contender_cfg(f"{cn.RECIPE}+sgd", 0, "unused", SMALL)
    rcnn, recipe = build_model(rcnn_cfg), build_model(recipe_cfg)
    assert isinstance(rcnn, GeneralizedRCNN) and not rcnn_cfg.MODEL.MASK_ON
    assert isinstance(rcnn.proposal_generator, RPN)
    assert isinstance(rcnn.roi_heads, StandardROIHeads)
    # the same ResNet-18 (BN, from scratch, nothing frozen): every trunk weight of one shape
    assert rcnn_cfg.MODEL.RESNETS.DEPTH == 18 and rcnn_cfg.MODEL.RESNETS.NORM == "BN"
    assert rcnn_cfg.MODEL.WEIGHTS == "" and rcnn_cfg.MODEL.BACKBONE.FREEZE_AT == 0
    assert _trunk_shapes(rcnn) == _trunk_shapes(recipe)
    # detectron2's FPN levels: P2-P5 to the ROI heads, P2-P6 to the RPN
    assert rcnn_cfg.MODEL.ROI_HEADS.IN_FEATURES == ["p2", "p3", "p4", "p5"]
    assert rcnn_cfg.MODEL.RPN.IN_FEATURES == ["p2", "p3", "p4", "p5", "p6"]
    assert set(rcnn.backbone.output_shape()) == {"p2", "p3", "p4", "p5", "p6"}
    # the protocol's data, optimizer and schedule, as every contender's
    for key in ("DATASETS", "SOLVER", "INPUT", "SEED"):
        assert rcnn_cfg[key] == sgd_cfg[key], key


def test_faster_rcnn_takes_the_regimes_classes_and_the_commands_overrides_last():
    thin = catalog.contender_cfg(cn.FASTER_RCNN, 0, "unused", regime="thin")
    assert thin.MODEL.ROI_HEADS.NUM_CLASSES == 10
    shapes = catalog.contender_cfg(cn.FASTER_RCNN, 0, "unused",
                                   ["MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", 64])
    assert shapes.MODEL.ROI_HEADS.NUM_CLASSES == 6
    assert shapes.MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE == 64  # the rcnn keys' 128 overridden


def test_faster_rcnn_trains_two_iterations_and_is_scored_through_the_protocol(tmp_path,
                                                                             dataset):
    from detectron2.data import DatasetCatalog

    from fcos_d2.data import register_coco_dataset

    name = "train_quality_faster_rcnn_toy"  # conftest's 4 synthetic-shapes images, 6 classes
    if name not in DatasetCatalog.list():
        register_coco_dataset(name, str(dataset / "annotations.json"), str(dataset / "images"))
    opts = [*SMALL, "DATASETS.TRAIN", (name,), "DATASETS.TEST", (name,),
            "SOLVER.MAX_ITER", 2, "SOLVER.STEPS", (), "SOLVER.IMS_PER_BATCH", 2,
            "INPUT.MIN_SIZE_TRAIN", (64,), "INPUT.MAX_SIZE_TRAIN", 64,
            "INPUT.MIN_SIZE_TEST", 64, "INPUT.MAX_SIZE_TEST", 64]
    torch.set_num_threads(1)
    [result] = catalog.contender(cn.FASTER_RCNN).run(0, str(tmp_path / "run"), opts)
    assert result["contender"] == cn.FASTER_RCNN and result["status"] == "ok"
    assert result["iterations"] == 2 and 0 <= result["AP"] <= 100
    assert {"loss_rpn_cls", "loss_rpn_loc", "loss_cls", "loss_box_reg"} <= \
        set(result["final_losses"])
    assert (tmp_path / "run" / "model_final.pth").is_file()
    record = repository_record({**result, "opts": []}, "test")
    assert record["run"]["iterations"] == 2
    assert record["times"]["seconds_per_iteration"] == \
        round(result["train_seconds"] / 2, 4)
