"""The trainer hook that leaves step 2's result as a plain FCOS checkpoint."""
import os

import torch
from detectron2.engine import HookBase
from detectron2.utils import comm
from ...parallel import unwrap_ddp

from ...checkpoint.atomic import atomic_write
from .weights import fcos_state_dict

FCOS_WEIGHTS_FILE = "model_final_fcos.pth"


class SaveFCOSWeights(HookBase):
    """After training, writes ``<folder>/model_final_fcos.pth``: the model's weights
    without the LEF and the adapter, which load strictly into the plain FCOS of the same
    config (``MODEL.META_ARCHITECTURE "FCOS"``, ``MODEL.LABELENC.STEP 0``). The checkpoints
    (``model_final.pth`` ...) keep everything, so that a run resumes exactly."""

    def __init__(self, folder: str):
        self.folder = folder

    def after_train(self):
        # trainer.iter reaches max_iter only when the training finished (not on an error)
        if not comm.is_main_process() or self.trainer.iter < self.trainer.max_iter:
            return
        model = unwrap_ddp(self.trainer.model)
        state = fcos_state_dict(model.state_dict())
        payload = {"model": state, "iteration": self.trainer.max_iter - 1,
                   "__author__": "fcos-d2 LabelEnc step 2 (plain FCOS weights)"}
        atomic_write(os.path.join(self.folder, FCOS_WEIGHTS_FILE),
                     lambda f: torch.save(payload, f))
