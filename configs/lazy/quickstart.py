# LazyConfig twin of configs/quickstart.yaml (see its comments for why each value): FCOS with
# a ResNet-18 trained from scratch on P3-P4 of the built-in synthetic shapes, 128-px images.
#
#     python tools/lazyconfig_train_net.py --config-file configs/lazy/quickstart.py
import torch
from detectron2.config import LazyCall as L
from detectron2.layers import ShapeSpec
from detectron2.modeling.backbone import ResNet
from detectron2.solver.build import get_default_optimizer_params

from .fcos_R_50_FPN_1x import dataloader, lr_multiplier, model, train

bottom_up = model.backbone.bottom_up
bottom_up.stem.norm = "BN"  # from scratch: FrozenBN only suits pretrained weights
bottom_up.stages = L(ResNet.make_default_stages)(depth=18, norm="BN")
bottom_up.out_features = ["res3", "res4"]  # no res5: res4 already sees the whole image
bottom_up.freeze_at = 0
model.backbone.out_channels = 96
model.backbone.top_block = None  # no P6/P7 (TOP_BLOCKS_IN "")

model.head.input_shape = [ShapeSpec(channels=96)] * 2
model.head.num_convs = 2
model.head_in_features = ["p3", "p4"]
model.sizes_of_interest = [32]
model.num_classes = 6  # circle, square, triangle, star, cross, ring
model.pixel_mean = [127.5, 127.5, 127.5]  # the synthetic images span 0..255
model.pixel_std = [64.0, 64.0, 64.0]
model.channels_last = True  # NHWC convolutions

dataloader.train.dataset.names = "synthetic_shapes_train"
dataloader.train.mapper.augmentations[0].short_edge_length = (128,)
dataloader.train.mapper.augmentations[0].max_size = 128
dataloader.train.total_batch_size = 8
dataloader.train.num_workers = 0  # loading in the main process: the 2 cores compute
dataloader.test.dataset.names = "synthetic_shapes_val"
dataloader.test.mapper.augmentations[0].short_edge_length = 128
dataloader.test.mapper.augmentations[0].max_size = 128
dataloader.test.num_workers = 0

# AdamW, lr 1e-3, weight decay 0.05, none on norms and biases, biases at the base lr
# (SOLVER.OPTIMIZER "ADAMW" in the yaml).
optimizer = L(torch.optim.AdamW)(
    params=L(get_default_optimizer_params)(
        base_lr="${..lr}", weight_decay_norm=0.0, bias_lr_factor=1.0, weight_decay_bias=0.0),
    lr=0.001,
    betas=(0.9, 0.999),
    weight_decay=0.05,
)
# lr x0.1 at 1300 and 1500 of 1600 iterations, 100 iterations of linear warm-up from lr / 3.
lr_multiplier.scheduler.milestones = [1300, 1500]
lr_multiplier.scheduler.num_updates = 1600
lr_multiplier.warmup_length = 100 / 1600
lr_multiplier.warmup_method = "linear"

# bf16 autocast on a CPU with native bf16 (float32 on other CPUs: train.amp.cpu_bf16 "auto"),
# fp16 AMP on a GPU
train.amp.enabled = True
train.output_dir = "output/quickstart_lazy"
train.init_checkpoint = ""  # from scratch
train.max_iter = 1600
train.checkpointer.period = 800
train.eval_period = 0  # once, after the last iteration
