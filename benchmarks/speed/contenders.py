"""The models and inputs that ``python -m benchmarks.speed`` compares: R-50 FCOS as fcos-d2
builds it (configs/FCOS-R50.yaml), as torchvision builds it, and as detectron2 builds it
(its built-in ``FCOS`` meta-architecture, from its model-zoo LazyConfig).

Every contender is wrapped so that the benchmark calls the same three things on each:
``infer(images)`` with a (N, 3, H, W) float batch in 0..255, ``loss(images, targets)``
returning the summed training loss, ``model`` (the nn.Module to optimise) and
``optimizer(model)``, the optimizer its project trains it with (the training rows time its
step too): fcos-d2's ``build_optimizer`` (fused SGD; configs/FCOS-R50.yaml's parameter
groups: biases at twice the lr and without weight decay), detectron2's model-zoo SGD (no
weight decay on norms), the SGD of torchvision's detection references (weight decay on
all); momentum 0.9, weight decay 1e-4 and a base lr of 1e-4 for all.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch
from torch import Tensor, nn

import fcos_d2
from detectron2.config import get_cfg
from detectron2.layers import ShapeSpec  # noqa: F401  (for the rows that build heads)
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances
from detectron2.utils.events import EventStorage
from fcos_d2.modeling.fast_inference import fast_inference_enabled, inference_model

REPO = Path(__file__).resolve().parents[2]
NUM_CLASSES = 80
LR = 1e-4  # every contender's learning rate: small steps keep random weights tame


def torchvision_sgd(model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer of torchvision's detection references (``references/detection``):
    SGD over the trainable parameters, momentum 0.9, weight decay 1e-4 on all of them."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=1e-4)


def detectron2_sgd(model: nn.Module) -> torch.optim.Optimizer:
    """detectron2's model-zoo optimizer (``common/optim.py``'s SGD, the LazyConfig FCOS's):
    its parameter groups without weight decay on norms, momentum 0.9, weight decay 1e-4."""
    from detectron2.solver.build import get_default_optimizer_params

    params = get_default_optimizer_params(model, weight_decay_norm=0.0)
    return torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=1e-4)


def fcos_d2_optimizer(cfg) -> Callable[[nn.Module], torch.optim.Optimizer]:
    """fcos-d2's ``build_optimizer`` for ``cfg`` (its SOLVER), at the benchmark's lr."""
    from fcos_d2.engine.optimizer import build_optimizer

    cfg = cfg.clone()
    cfg.SOLVER.BASE_LR = LR
    return lambda model: build_optimizer(cfg, model)


@dataclass
class Contender:
    name: str
    model: nn.Module
    infer: Callable[[Tensor], object]
    loss: Callable[[Tensor, List[Dict[str, Tensor]]], Tensor]
    backbone_head: Callable[[Tensor], object]  # no pre- or post-processing
    optimizer: Callable[[nn.Module], torch.optim.Optimizer] = torchvision_sgd


def fcos_d2_cfg(device: str, **fcos):
    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "FCOS-R50.yaml"))
    cfg.MODEL.DEVICE, cfg.MODEL.WEIGHTS = device, ""
    cfg.MODEL.FCOS.INFERENCE_BACKEND = "eager"  # rows say their precision; "auto": backends row
    for key, value in fcos.items():
        setattr(cfg.MODEL.FCOS, key, value)
    return cfg


def _d2_inputs(images: Tensor, targets=None) -> List[dict]:
    """detectron2's list of dicts; the model's preprocessing normalises the 0..255 pixels."""
    inputs = []
    for i, image in enumerate(images):
        entry = {"image": image}
        if targets is not None:
            instances = Instances(tuple(image.shape[-2:]))
            instances.gt_boxes = Boxes(targets[i]["boxes"])
            instances.gt_classes = targets[i]["labels"]
            entry["instances"] = instances
        inputs.append(entry)
    return inputs


def _summed_losses(model: nn.Module, inputs: List[dict]) -> Tensor:
    with EventStorage(0):  # detectron2's FCOS logs to the event storage in training
        return sum(model(inputs).values())


def _detectron2_style(name: str, model: nn.Module,
                      optimizer: Callable[[nn.Module], torch.optim.Optimizer] = detectron2_sgd
                      ) -> Contender:
    def backbone_head(images):
        features = model.backbone(images)
        return model.head([features[f] for f in model.head_in_features])

    return Contender(
        name, model,
        infer=lambda images: model(_d2_inputs(images)),
        loss=lambda images, targets: _summed_losses(model, _d2_inputs(images, targets)),
        backbone_head=backbone_head, optimizer=optimizer)


detectron2_style = _detectron2_style  # the rows outside this module use the public name


def detectron2_version() -> str:
    return __import__("detectron2").__version__


def detectron2_has_fcos() -> bool:
    """Whether this detectron2 has its built-in FCOS (``meta_arch.fcos``: in main; some
    builds that call themselves v0.6 predate it)."""
    import importlib.util

    return importlib.util.find_spec("detectron2.modeling.meta_arch.fcos") is not None


def fcos_d2_contender(device: str, image_size=None, **fcos) -> Contender:
    """fcos-d2's R-50 FCOS, random weights; ``fcos``: MODEL.FCOS overrides."""
    cfg = fcos_d2_cfg(device, **fcos)
    return _detectron2_style("fcos-d2", build_model(cfg).to(device), fcos_d2_optimizer(cfg))


def fcos_d2_inference_contender(device: str, image_size=None, **fcos) -> Contender:
    """fcos-d2's R-50 FCOS as inference runs it (``inference_model``: the folded,
    channels_last copy unless ``FAST_INFERENCE=False``), eval mode, random weights."""
    cfg = fcos_d2_cfg(device, **fcos)
    model = build_model(cfg).to(device).eval()
    return _detectron2_style("fcos-d2", inference_model(model, fast_inference_enabled(cfg)))


def fcos_d2_eval_mode_infer(device: str, **fcos) -> Callable[[Tensor], object]:
    """fcos-d2's R-50 FCOS as a detectron2 user runs it by hand: ``build_model(cfg)``,
    ``model.eval()``, ``model(inputs)`` (the model's own eval-mode fast path)."""
    model = build_model(fcos_d2_cfg(device, **fcos)).to(device).eval()
    return lambda images: model(_d2_inputs(images))


def default_predictor_infer(device: str, image_size: Tuple[int, int],
                            **fcos) -> Callable[[Tensor], object]:
    """fcos-d2's R-50 FCOS through detectron2's ``DefaultPredictor(cfg)``, one image at a
    time as it takes them: (H, W, 3) uint8 arrays, its resizing included (set to keep
    ``image_size`` (H, W), as the other contenders). The arrays are made before timing."""
    from detectron2.engine import DefaultPredictor

    cfg = fcos_d2_cfg(device, **fcos)
    cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST = min(image_size), max(image_size)
    predictor = DefaultPredictor(cfg)
    converted = {"of": None, "arrays": []}  # the batch last converted (held: no id reuse)

    def infer(images):
        if converted["of"] is not images:  # (N, 3, H, W) floats in 0..255 -> (H, W, 3) uint8
            converted["of"] = images
            converted["arrays"] = [x.permute(1, 2, 0).byte().cpu().numpy() for x in images]
        return [predictor(array) for array in converted["arrays"]]
    return infer


def group_norm_32(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32 if channels % 32 == 0 else 1, channels)


def detectron2_fcos_contender(device: str, image_size=None) -> Contender:
    """detectron2's built-in FCOS (``detectron2.modeling.meta_arch.fcos.FCOS``, in v0.6
    and main) from its model zoo's fcos_R_50_FPN_1x, random weights."""
    from detectron2 import model_zoo
    from detectron2.config import instantiate

    cfg = model_zoo.get_config("COCO-Detection/fcos_R_50_FPN_1x.py").model
    cfg.backbone.bottom_up.freeze_at = 2
    # The same GN(32) towers; v0.6 probes its norm with get_norm("GN", 1), which current
    # torch rejects (1 channel in 32 groups), so pass the norm as a callable.
    cfg.head.norm = group_norm_32
    model = instantiate(cfg).to(device)
    name = f"detectron2 {__import__('detectron2').__version__} FCOS"
    return _detectron2_style(name, model)


def torchvision_contender(device: str, image_size: Tuple[int, int] = (800, 1216)) -> Contender:
    """torchvision's ``fcos_resnet50_fpn(weights=None, weights_backbone=None)``: without
    pretrained weights it trains every layer with plain BatchNorm (fcos-d2 and detectron2
    freeze the stem and res2 and use frozen BN, as for a pretrained backbone). Its resizing
    is set to keep ``image_size`` (H, W) as it is (the default keeps 800x1216 anyway)."""
    from torchvision.models.detection import fcos_resnet50_fpn

    model = fcos_resnet50_fpn(weights=None, weights_backbone=None, min_size=min(image_size),
                              max_size=max(image_size)).to(device)
    return torchvision_style("torchvision", model)


def torchvision_style(name: str, model: nn.Module) -> Contender:
    """A torchvision detector taking a list of 0..1 images (and targets in training)."""
    def backbone_head(images):
        return model.head(list(model.backbone(images / 255).values()))

    def loss(images, targets):
        return sum(model([x / 255 for x in images], targets).values())

    return Contender(name, model, infer=lambda images: model([x / 255 for x in images]),
                     loss=loss, backbone_head=backbone_head, optimizer=torchvision_sgd)


CONTENDERS = {"fcos-d2": fcos_d2_contender, "torchvision": torchvision_contender,
              "detectron2": detectron2_fcos_contender}


def random_images(batch: int, height: int, width: int, device: str) -> Tensor:
    generator = torch.Generator().manual_seed(0)
    return (torch.rand(batch, 3, height, width, generator=generator) * 255).to(device)


def random_targets(batch: int, num_boxes: int, height: int, width: int,
                   device: str) -> List[Dict[str, Tensor]]:
    """``num_boxes`` boxes of 8 px to half the image per image, random classes."""
    generator = torch.Generator().manual_seed(1)
    targets = []
    for _ in range(batch):
        xy = torch.rand(num_boxes, 2, generator=generator) * torch.tensor([width, height]) * 0.8
        wh = 8 + torch.rand(num_boxes, 2, generator=generator) * torch.tensor([width, height]) / 2
        far = torch.minimum(xy + wh, torch.tensor([width - 1.0, height - 1.0]))
        targets.append({"boxes": torch.cat([xy, far], 1).to(device),
                        "labels": torch.randint(0, NUM_CLASSES, (num_boxes,),
                                                generator=generator).to(device)})
    return targets
