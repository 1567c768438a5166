"""FAD's three commands end to end, as the README gives them, made tiny: a two-iteration
search (tools/fad_search.py), training the searched head for two iterations (train_net.py
with MODEL.FAD.GENOTYPE_FILE), and evaluating it (--eval-only)."""
import re

import torch

from fcos_d2.modeling.fad.genotypes import read_genotype_file
from fcos_d2.modeling.fad.ops import op_spec

TINY = ["MODEL.FPN.OUT_CHANNELS", "32", "SOLVER.IMS_PER_BATCH", "2",
        "SOLVER.WARMUP_ITERS", "1"]


def succeeded(run):
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    return run


def test_search_then_train_then_evaluate_the_searched_head(scripts, dataset, tmp_path):
    search_dir, train_dir = tmp_path / "search", tmp_path / "train"
    succeeded(scripts.run(
        "tools/fad_search.py", "--config-file", "configs/FAD/FAD-tiny-search.yaml", *TINY,
        "INPUT.MIN_SIZE_TRAIN", "(64,)", "INPUT.MAX_SIZE_TRAIN", "64", "SOLVER.MAX_ITER", "2",
        "OUTPUT_DIR", str(search_dir)))
    genotype = search_dir / "genotype.log"
    box, cls = read_genotype_file(genotype)
    assert box.num_nodes == cls.num_nodes == 3

    dataset = ["--register-coco", "tiny", str(dataset / "annotations.json"),
               str(dataset / "images")]
    common = ["--config-file", "configs/FAD/FAD-tiny-train.yaml", *dataset, *TINY,
              "MODEL.FAD.GENOTYPE_FILE", str(genotype), "DATASETS.TRAIN", "('tiny',)",
              "DATASETS.TEST", "('tiny',)", "MODEL.FCOS.INFERENCE_TH_TEST", "0.0",
              "OUTPUT_DIR", str(train_dir)]
    train = succeeded(scripts.run("train_net.py", *common, "SOLVER.MAX_ITER", "2"))
    assert (train_dir / "model_final.pth").is_file()
    assert "copypaste: AP," in train.stdout + train.stderr
    evaluate = succeeded(scripts.run("train_net.py", "--eval-only", *common, "MODEL.WEIGHTS",
                                     str(train_dir / "model_final.pth")))
    log = evaluate.stdout + evaluate.stderr
    assert re.search(r"copypaste: \d+\.\d+,", log), log[-2000:]  # an AP was computed
    # the trained weights are the searched head's: each box edge stacks its op's layers
    state = torch.load(train_dir / "model_final.pth", map_location="cpu")["model"]
    for node, edges in enumerate(box.nodes):
        for e, edge in enumerate(edges):
            prefix = f"head.box_tower.cells.0.dag.{node}.{e}.op."
            layers = {k[len(prefix):].split(".")[1] for k in state
                      if k.startswith(prefix + "layers.")}
            spec = op_spec(edge.op)
            assert layers == {str(i) for i in range(spec.depth)}, (edge, layers)
            assert any(k.startswith(prefix + "dilated.") for k in state) == spec.dilated
