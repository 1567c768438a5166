# LazyConfig twin of configs/FCOS-R50.yaml (= official FCOS_imprv_R_50_FPN_1x, 38.7 AP
# published by the official repo, not reproduced here): the same model, data, optimizer and
# schedule, built from the same constructors with explicit arguments.
#
#     python tools/lazyconfig_train_net.py --config-file configs/lazy/fcos_R_50_FPN_1x.py
#
# or in your own script: cfg = LazyConfig.load(path); model = instantiate(cfg.model).
# tests/engine/test_lazy_config.py checks that both configs build the same model.
import fcos_d2  # noqa: F401  (first: detectron2 v0.6 shims; registers the datasets)
import torch
from detectron2.config import LazyCall as L
from detectron2.data import (DatasetMapper, build_detection_test_loader,
                             build_detection_train_loader, get_detection_dataset_dicts)
from detectron2.data import transforms as T
from detectron2.evaluation import COCOEvaluator
from detectron2.layers import ShapeSpec
from detectron2.modeling.backbone import FPN, BasicStem, ResNet
from detectron2.modeling.backbone.fpn import LastLevelP6P7
from detectron2.solver import WarmupParamScheduler
from detectron2.solver.build import get_default_optimizer_params
from fvcore.common.param_scheduler import MultiStepParamScheduler
from omegaconf import OmegaConf

from fcos_d2 import FCOS, FCOSHead, compat

model = L(FCOS)(
    # = build_fcos_resnet_fpn_backbone: detectron2's ResNet + FPN, P6/P7 from P5
    backbone=L(FPN)(
        bottom_up=L(ResNet)(
            stem=L(BasicStem)(in_channels=3, out_channels=64, norm="FrozenBN"),
            stages=L(ResNet.make_default_stages)(depth=50, stride_in_1x1=True, norm="FrozenBN"),
            out_features=["res3", "res4", "res5"],
            freeze_at=2,
        ),
        in_features="${.bottom_up.out_features}",
        out_channels=256,
        # in_feature "res5" (in_channels 2048) for the original FCOS
        top_block=L(LastLevelP6P7)(in_channels=256, out_channels=256, in_feature="p5"),
    ),
    # = FCOSHead.from_config; one ShapeSpec per level, channels = the FPN's out_channels
    head=L(FCOSHead)(
        input_shape=[ShapeSpec(channels=256)] * 5,
        num_classes="${..num_classes}",
        num_convs=4,
        num_share_convs=0,
        norm="GN",
        use_deformable=False,
        prior_prob=0.01,
        norm_reg_targets="${..norm_reg_targets}",
        centerness_on_reg=True,
        reg_activation="",
        use_scale=True,
    ),
    head_in_features=["p3", "p4", "p5", "p6", "p7"],
    num_classes=80,
    # The official FCOS normalizes BGR input with this mean (std 1); its checkpoints expect it.
    pixel_mean=[102.9801, 115.9465, 122.7717],
    pixel_std=[1.0, 1.0, 1.0],
    input_format="BGR",
    # Every other argument as MODEL.FCOS's defaults (fcos_d2/config.py explains each one).
    sizes_of_interest=[64, 128, 256, 512],
    center_sampling_radius=1.5,
    focal_loss_alpha=0.25,
    focal_loss_gamma=2.0,
    loc_loss_type="giou",
    norm_reg_targets=True,
    loss_normalizer="num_pos",
    loss_normalizer_ema=(300.0, 0.9),
    loc_loss_weighting="centerness",
    iou_loss_smooth=1.0,
    assigner="fcos",
    atss_topk=9,
    atss_anchor_scale=8.0,
    cls_loss="focal",
    score_thresh=0.05,
    score_thresh_on="probability",
    topk_candidates=1000,
    nms_thresh=0.6,
    max_detections_per_image=100,
)

dataloader = OmegaConf.create()
dataloader.train = L(build_detection_train_loader)(
    dataset=L(get_detection_dataset_dicts)(names="coco_2017_train", filter_empty=False),
    mapper=L(DatasetMapper)(
        is_train=True,
        augmentations=[
            L(T.ResizeShortestEdge)(short_edge_length=(800,), max_size=1333, sample_style="choice"),
            L(T.RandomFlip)(horizontal=True),
        ],
        image_format="BGR",
    ),
    total_batch_size=16,
    num_workers=4,
)
dataloader.test = L(build_detection_test_loader)(
    dataset=L(get_detection_dataset_dicts)(names="coco_2017_val", filter_empty=False),
    mapper=L(DatasetMapper)(
        is_train=False,
        augmentations=[
            L(T.ResizeShortestEdge)(short_edge_length=800, max_size=1333, sample_style="choice")],
        image_format="${...train.mapper.image_format}",
    ),
    num_workers=4,
)
# Without detectron2's C++ extension COCOEvaluator must use pycocotools' COCOeval.
dataloader.evaluator = L(COCOEvaluator)(
    dataset_name="${..test.dataset.names}", tasks=("bbox",),
    use_fast_impl=compat.HAS_D2_EXTENSION,
)

# As the official FCOS (and SOLVER in Base-FCOS.yaml): biases learn twice as fast, without
# weight decay; norms without weight decay. params.model is set by the training script.
optimizer = L(torch.optim.SGD)(
    params=L(get_default_optimizer_params)(
        base_lr="${..lr}", weight_decay_norm=0.0, bias_lr_factor=2.0, weight_decay_bias=0.0),
    lr=0.01,
    momentum=0.9,
    weight_decay=1e-4,
)

# lr x0.1 at 60k and 80k of 90k iterations; 500 iterations of constant warm-up at lr / 3.
# As in detectron2's LazyConfigs, the schedule is relative: milestones count in units of
# num_updates, so with another train.max_iter it stretches (set both to keep it absolute).
lr_multiplier = L(WarmupParamScheduler)(
    scheduler=L(MultiStepParamScheduler)(
        values=[1.0, 0.1, 0.01], milestones=[60000, 80000], num_updates=90000),
    warmup_length=500 / 90000,
    warmup_method="constant",
    warmup_factor=1.0 / 3,
)

# The keys of detectron2's configs/common/train.py, read by tools/lazyconfig_train_net.py.
train = dict(
    output_dir="output/fcos_R_50_1x_lazy",
    init_checkpoint="detectron2://ImageNetPretrained/MSRA/R-50.pkl",
    max_iter=90000,
    # cpu_bf16: on a CPU, bf16 autocast only where the CPU has native bf16 ("auto"; float32
    # elsewhere, said in the log) or "always" (MODEL.FCOS.CPU_BF16 of the YAML configs).
    amp=dict(enabled=False, cpu_bf16="auto"),
    ddp=dict(broadcast_buffers=False, find_unused_parameters=False, fp16_compression=False),
    checkpointer=dict(period=5000, max_to_keep=100),
    eval_period=0,  # evaluate at the end only (TEST.EVAL_PERIOD 0)
    # The schedule in epochs (SOLVER.EPOCHS & co. of the YAML configs; 0 or []: off): when
    # set, they replace max_iter, the LR milestones (made absolute: num_updates = max_iter),
    # the warm-up, checkpointer.period and eval_period, derived from the training set's
    # size and dataloader.train.total_batch_size (fcos_d2/engine/schedule.py).
    epochs=0,
    steps_epochs=[],
    warmup_epochs=0.0,
    checkpoint_period_epochs=0,
    eval_period_epochs=0,
    log_period=20,
    device="cuda",  # falls back to cpu without CUDA (tools/lazyconfig_train_net.py)
)
