"""The NAS-FCOS search on two data-parallel CPU workers (fcos_d2.engine.launch, gloo), on
the tiny setting of test_nas_fcos_search.py: the records hold every sample once, both
workers end with the same controllers, only the main worker writes the state, a sample's
reward does not depend on the worker that trained it, the written config builds, and
--resume continues with two workers.

Each worker runs 3 FPN samples (a full round of 2, then a round of 1 where worker 1 waits)
and 2 head samples, then resumes to 5 FPN samples (one more round of 2).
"""
import json
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog
from detectron2.data.datasets import register_coco_instances
from detectron2.modeling import build_model
from detectron2.utils import comm

from fcos_d2 import add_fcos_config
from fcos_d2.modeling.nas_fcos.search import Controller, fpn_decisions, loop
from fcos_d2.modeling.nas_fcos.search import __main__ as nas_search

OPTS = ["MODEL.NAS_FCOS.CHANNELS", "32"]  # config overrides come last


def argv(output, fpn_samples: int, head_samples: int = 2, *extra) -> list:
    return ["--dataset", "nas_ddp_tiny", "--train-images", "2", "--val-images", "2",
            "--head-samples", str(head_samples), "--proxy-iterations", "1",
            "--batch-size", "2", "--num-cells", "3", "--head-layers", "2",
            "--output", str(output), "--fpn-samples", str(fpn_samples), *extra, *OPTS]


def register(dataset: str) -> None:
    if "nas_ddp_tiny" not in DatasetCatalog.list():
        register_coco_instances("nas_ddp_tiny", {}, f"{dataset}/annotations.json",
                                f"{dataset}/images")


def search_worker(dataset: str, folder: str) -> None:
    """Each worker: the search, then a resumed one; saves its controllers (PPO states after
    each search) and the state files it wrote to rank<r>.pth."""
    register(dataset)
    folder, rank = Path(folder), comm.get_rank()
    made, writes, save = [], [], loop.save_state

    class RecordedPPO(loop.PPO):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    loop.PPO = RecordedPPO
    loop.save_state = lambda state, path: (writes.append(len(state["records"])),
                                           save(state, path))
    parser = nas_search.argument_parser()
    nas_search.search(parser.parse_args(argv(folder / "search", 3)))
    first = [ppo.state_dict() for ppo in made]
    nas_search.search(parser.parse_args(argv(folder / "search", 5, 2, "--resume")))
    torch.save({"first": first, "resumed": [ppo.state_dict() for ppo in made[2:]],
                "writes": writes}, folder / f"rank{rank}.pth")


@pytest.fixture(scope="module")
def workers(dataset, tmp_path_factory):
    if torch.cuda.is_available():
        pytest.skip("CPU workers are spawned only where CUDA is not available")
    from fcos_d2.engine.launch import launch

    folder = tmp_path_factory.mktemp("nas_ddp")
    launch(search_worker, 2, dist_url="auto", args=(str(dataset), str(folder)))
    return folder, [torch.load(folder / f"rank{r}.pth", weights_only=False) for r in range(2)]


def assert_same_state(first, second, where):
    if isinstance(first, dict):
        assert first.keys() == second.keys(), where
        for key in first:
            assert_same_state(first[key], second[key], f"{where}.{key}")
    elif isinstance(first, (list, tuple)):
        assert len(first) == len(second), where
        for i, (a, b) in enumerate(zip(first, second)):
            assert_same_state(a, b, f"{where}[{i}]")
    elif isinstance(first, torch.Tensor):
        assert torch.equal(first, second), where
    else:
        assert first == second, where


def test_records_hold_every_sample_once_and_resume_adds_a_round(workers):
    folder, _ = workers
    records = json.loads((folder / "search" / "search_records.json").read_text())
    assert [(r["phase"], r["sample"]) for r in records] == [
        ("fpn", 0), ("fpn", 1), ("fpn", 2), ("head", 0), ("head", 1), ("fpn", 3), ("fpn", 4)]
    assert all(r["reward"] < 0 for r in records)  # minus a sum of losses
    assert records[0]["genotype"] != records[1]["genotype"]  # two samples, not one twice


def test_both_workers_end_with_the_same_controllers(workers):
    _, ranks = workers
    assert len(ranks[0]["first"]) == 2  # the FPN's and the head's
    for run in ("first", "resumed"):
        assert_same_state(ranks[0][run], ranks[1][run], run)
    torch.manual_seed(0)
    initial = Controller(*fpn_decisions(3)).state_dict()
    learned = ranks[0]["first"][0]["controller"]
    assert any(not torch.equal(initial[k], learned[k]) for k in initial)  # PPO moved it
    assert ranks[0]["first"][0]["baseline"] is not None


def test_only_the_main_worker_writes_the_state(workers):
    _, ranks = workers
    # after each round: FPN 2, 3 (rounds of 2 and 1), head 5; resumed: FPN 7; head done
    assert ranks[0]["writes"] == [2, 3, 5, 7]
    assert ranks[1]["writes"] == []


def test_a_sample_reward_does_not_depend_on_the_worker(workers, dataset, tmp_path):
    folder, _ = workers
    register(str(dataset))
    nas_search.main(argv(tmp_path, 1, 1))  # one process: FPN sample 0, then head sample 0
    alone = json.loads((tmp_path / "search_records.json").read_text())
    parallel = json.loads((folder / "search" / "search_records.json").read_text())
    # same draw, same seeded proxy, same reward: up to float rounding, which can differ
    # between processes with other thread counts (it did under load: 5e-7 of 2.73)
    assert alone[0].keys() == parallel[0].keys()
    assert {k: v for k, v in alone[0].items() if k != "reward"} == \
        {k: v for k, v in parallel[0].items() if k != "reward"}
    assert alone[0]["reward"] == pytest.approx(parallel[0]["reward"], rel=1e-5, abs=0)


def test_the_written_config_builds(workers):
    folder, _ = workers
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(folder / "search" / "best.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    model = build_model(cfg).eval()
    assert len(model.backbone.cells) == 3
    with torch.no_grad():
        model([{"image": torch.zeros(3, 64, 64)}])


def test_the_module_entry_runs_one_worker_and_names_the_launching_script():
    with pytest.raises(SystemExit, match="tools/nas_fcos_search.py"):
        nas_search.main(["--num-workers", "2"])
