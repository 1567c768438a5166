"""Synthetic-shapes images as detectron2 input dicts, rendered in memory, and a short
SGD training loop: the small trained models of the proposal-generator and TTA tests."""
from typing import Dict, List, Tuple

import torch
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances
from detectron2.utils.events import EventStorage

from fcos_d2.data import synthetic


def sample(split: str, index: int) -> Dict:
    """Image ``index`` of a synthetic split (as ``synthetic_shapes_<split>`` has it) as an
    input dict: "image" (3, 128, 128) uint8 BGR, as the test loader gives it, and
    "instances" with ``gt_boxes`` and ``gt_classes``."""
    pixels, objects = synthetic.render_image(seed=synthetic.SPLIT_SEEDS[split], index=index)
    instances = Instances(pixels.shape[:2])
    xywh = torch.tensor([synthetic.tight_box(o.visible_mask) for o in objects],
                        dtype=torch.float32).reshape(-1, 4)
    instances.gt_boxes = Boxes(torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1))
    instances.gt_classes = torch.tensor([o.class_index for o in objects], dtype=torch.int64)
    image = torch.from_numpy(pixels[:, :, ::-1].copy()).permute(2, 0, 1)  # (3, H, W) BGR
    return {"image": image, "instances": instances}


def train(cfg, train_set: List[Dict], iterations: int, batch_size: int = 4,
          lr: float = 0.01, seed: int = 0) -> Tuple[torch.nn.Module, List[Dict[str, float]]]:
    """``build_model(cfg)`` after ``iterations`` SGD steps on ``train_set`` in order (the
    same batches for every model), in eval mode; and the losses of every step."""
    torch.manual_seed(seed)
    model = build_model(cfg)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    history = []
    with EventStorage():
        for iteration in range(iterations):
            batch = [train_set[(iteration * batch_size + j) % len(train_set)]
                     for j in range(batch_size)]
            losses = model(batch)
            optimizer.zero_grad()
            sum(losses.values()).backward()
            optimizer.step()
            history.append({k: v.item() for k, v in losses.items()})
    return model.eval(), history
