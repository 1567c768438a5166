"""One process of the compile-cache test (tests/modeling/test_compile_cache.py): a toy
two-level "detector" through the bf16_compiled runner, weights as inputs, caching in argv[1],
on batches of the sizes argv[2] ("40x52,40x56": height x width, in order); then, with
argv[3] == "reload", new weights loaded into the compiled model. Prints a JSON line of what
inductor's cache did and what came out."""
import json
import logging
import os
import sys

import fcos_d2  # noqa: F401  (first: detectron2 shims)
import torch
from detectron2.structures import ImageList
from torch import nn
from torch._dynamo.utils import counters

from fcos_d2.modeling import compile_cache
from fcos_d2.modeling.inference_backends import BackendRunner


class Toy(nn.Module):
    """Levels at strides 1 and 2, one output head shared by both (as FCOS's)."""
    strides = (1, 2)

    def __init__(self, cache_dir: str):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.down = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.out = nn.Conv2d(8, 3, 1)
        self.compile_cache_dir, self.size_buckets, self.compile_freeze = cache_dir, 8, False

    def forward_head(self, images: ImageList):
        x = torch.relu(self.stem(images.tensor))
        outputs = [self.out(level) for level in (x, torch.relu(self.down(x)))]  # (N, 3, Hi, Wi)
        return ([o[:, :1] for o in outputs], [o[:, 1:2] for o in outputs],
                [o[:, 2:] for o in outputs])


def main(cache_dir: str, sizes: str, reload: bool) -> None:
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)  # inductor's cache follows ours
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    torch.manual_seed(0)
    model = Toy(cache_dir).eval()
    root = compile_cache.cache_root(cache_dir)
    warm = compile_cache.is_warm(root, compile_cache.model_key(model, "bf16_compiled"))
    runner = BackendRunner("bf16_compiled")
    level_shapes = []
    for size in sizes.split(","):
        height, width = map(int, size.split("x"))
        images = ImageList(torch.rand(1, 3, height, width), [(height, width)])
        first = runner(model, images)
        level_shapes.append([list(x.shape) for x in first[0]])
    result = {"warm_before": warm, "sizes": [list(s) for s in runner.compiled_sizes],
              "hits": counters["inductor"]["fxgraph_cache_hit"],
              "misses": counters["inductor"]["fxgraph_cache_miss"],
              "level_shapes": level_shapes}
    if reload:
        graphs = counters["stats"]["unique_graphs"]
        torch.manual_seed(1)
        model.load_state_dict(Toy(cache_dir).state_dict())  # new weights, in place
        second = runner(model, images)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            want = model.forward_head(images)[0][0].float()
        result.update(changed=not torch.equal(first[0][0], second[0][0]),
                      error=(second[0][0] - want).abs().max().item(),
                      new_graphs=counters["stats"]["unique_graphs"] - graphs,
                      misses_after=counters["inductor"]["fxgraph_cache_miss"])
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], len(sys.argv) > 3 and sys.argv[3] == "reload")
