"""The search's proxy task (re-implemented from the NAS-FCOS paper): each sampled decoder
(FPN and head) trains briefly on cached bottom-up features of a small image subset and is
rewarded with minus the sum of its detection losses on a held-out split.

The bottom-up stays fixed: the config's initialisation (seeded), or a trained detector's
(``bottom_up_weights``: e.g. the recipe's own ``model_final.pth``, so that decoders are
rewarded on the features the trained model will give them).

Symbols: N images of a batch, Ck the bottom-up features C2-C5.
"""
from typing import Dict, List, Sequence, Tuple

import torch
from detectron2.data import DatasetCatalog, DatasetMapper
from detectron2.data import transforms as T
from detectron2.modeling import build_model
from detectron2.structures import ImageList, Instances
from detectron2.utils.events import EventStorage
from torch import Tensor

from ....checkpoint.parts import load_bottom_up
from ...assignment import compute_locations
from ...layers import scale_offset_lr
from ..genotypes import FPNGenotype, HeadGenotype

Batch = Tuple[Dict[str, Tensor], List[Instances]]


def load_inputs(cfg, dataset: str, start: int, count: int) -> List[dict]:
    """``count`` images of ``dataset`` from index ``start``, resized for testing, with
    their instances (no random augmentation: every decoder sees the same data)."""
    dicts = DatasetCatalog.get(dataset)
    if len(dicts) < start + count:
        raise ValueError(f"dataset '{dataset}' has {len(dicts)} images; the search needs "
                         f"{start + count} (--train-images + --val-images)")
    mapper = DatasetMapper(is_train=True, image_format=cfg.INPUT.FORMAT, augmentations=[
        T.ResizeShortestEdge(cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST)])
    return [mapper(d) for d in dicts[start:start + count]]


class ProxyTask:
    """Trains decoders of ``cfg`` (a NASFCOS config) on cached features of fixed images."""

    def __init__(self, cfg, train: Sequence[dict], val: Sequence[dict], *, iterations: int,
                 batch_size: int, lr: float, bottom_up_weights: str = "",
                 offset_lr_factor: float = 1.0):
        self.cfg, self.iterations, self.lr = cfg.clone(), iterations, lr
        self.offset_lr_factor = offset_lr_factor  # the DCN offsets' lr: lr x this
        model = build_model(self.cfg).eval()
        self.bottom_up = model.backbone.bottom_up  # fixed: its init or a trained one
        if bottom_up_weights:
            load_bottom_up(self.bottom_up, bottom_up_weights)
        self.pixel_mean, self.pixel_std = model.pixel_mean, model.pixel_std
        self.divisibility = model.backbone.size_divisibility
        self.train = self._cache(train, batch_size)
        self.val = self._cache(val, batch_size)

    @torch.no_grad()
    def _cache(self, inputs: Sequence[dict], batch_size: int) -> List[Batch]:
        batches = []
        for i in range(0, len(inputs), batch_size):
            chunk = inputs[i:i + batch_size]
            images = ImageList.from_tensors([(x["image"].float() - self.pixel_mean)
                                             / self.pixel_std for x in chunk], self.divisibility)
            batches.append((self.bottom_up(images.tensor), [x["instances"] for x in chunk]))
        return batches

    def build_decoder(self, fpn: FPNGenotype, head: HeadGenotype):
        cfg = self.cfg.clone()
        cfg.defrost()
        cfg.MODEL.NAS_FCOS.FPN_GENOTYPE = fpn.to_config()
        cfg.MODEL.NAS_FCOS.HEAD_GENOTYPE, cfg.MODEL.NAS_FCOS.HEAD_SHARE_INDEX = head.to_config()
        model = build_model(cfg)
        model.backbone.bottom_up = None  # features come from the cache
        # Each worker of a data-parallel search trains its own sample: its losses are its own.
        model.normalize_over_workers = False
        return model

    @staticmethod
    def losses(model, batch: Batch) -> Dict[str, Tensor]:
        features, instances = batch
        pyramid = model.backbone.pyramid(features)
        logits, regression, centerness = model.head([pyramid[f] for f in model.head_in_features])
        locations = compute_locations([x.shape[-2:] for x in logits], model.strides, "cpu")
        return model.losses(locations, instances, logits, regression, centerness)

    def reward(self, fpn: FPNGenotype, head: HeadGenotype, seed: int = 0) -> float:
        """Minus the summed held-out losses after ``iterations`` AdamW steps (deformable
        convs' offset predictors at ``offset_lr_factor`` x the lr, as the rows train)."""
        torch.manual_seed(seed)
        model = self.build_decoder(fpn, head).train()
        groups = [{"params": [p for p in model.parameters() if p.requires_grad], "lr": self.lr}]
        optimizer = torch.optim.AdamW(scale_offset_lr(groups, model, self.offset_lr_factor),
                                      lr=self.lr)
        with EventStorage():
            for step in range(self.iterations):
                loss = sum(self.losses(model, self.train[step % len(self.train)]).values())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            with torch.no_grad():  # BN keeps its batch statistics, as in training
                held_out = [sum(self.losses(model, b).values()).item() for b in self.val]
        return -sum(held_out) / len(held_out)
