"""FAD's search on two data-parallel CPU workers (fcos_d2.engine.launch, gloo): every worker
ends with the same weights, architecture weights and buffers; only the main worker writes
the genotype files; a resumed run equals a straight one; and one step of 2 workers with one
image each averages exactly the gradients that one process computes on both images.

The tiny supernet of test_fad_search.py (ResNet-18, 32-channel FPN and edges, 64-px
images), 2 images a batch. Its backbone has BatchNorm, whose batch statistics depend on
how a batch is split: the gradient comparison uses FrozenBN (and no random flip, whose
draws are seeded per worker and iteration), where the split changes nothing.
"""
from pathlib import Path

import pytest
import torch
from detectron2.utils import comm

from fcos_d2.engine.launch import launch
from fcos_d2.modeling.fad import search as fad_search
from fcos_d2.modeling.fad.genotypes import read_genotype_file

TINY = ["MODEL.FPN.OUT_CHANNELS", "32", "INPUT.MIN_SIZE_TRAIN", "(64,)",
        "INPUT.MAX_SIZE_TRAIN", "64", "SOLVER.IMS_PER_BATCH", "2", "SOLVER.MAX_ITER", "2",
        "SOLVER.CHECKPOINT_PERIOD", "1", "MODEL.FAD.SEARCH.GENOTYPE_PERIOD", "1"]
SPLIT_INDEPENDENT = ["MODEL.RESNETS.NORM", "FrozenBN", "INPUT.RANDOM_FLIP", "none"]
SECOND_ORDER = ["MODEL.FAD.SEARCH.SECOND_ORDER", "True"]


def tiny_cfg(output, *opts):
    args = fad_search.default_argument_parser().parse_args(
        ["--config-file", "configs/FAD/FAD-tiny-search.yaml", *TINY, "OUTPUT_DIR",
         str(output), *opts])
    return fad_search.setup(args)


def first_step_gradients(output, *opts) -> list:
    """The averaged gradients of iteration 0: [architecture weights', weights'] (first
    order; second order: the virtual step's weights', dL_val/dw', then those two)."""
    recorded, average = [], fad_search.average_over_workers

    def recording(tensors):
        average(tensors)
        recorded.append([t.clone() for t in tensors])

    fad_search.average_over_workers = recording
    try:
        fad_search.Search(tiny_cfg(output, *SPLIT_INDEPENDENT, *opts)).step(0)
    finally:
        fad_search.average_over_workers = average
    return recorded[:-1]  # the last call averages the buffers


def final_state(search) -> dict:
    return {k: v.clone() for k, v in search.model.state_dict().items()}


def search_worker(folder: str) -> None:
    """Each worker: the split-independent first step, a straight 2-iteration search (the
    genotype writes counted), and one interrupted after 1 iteration and resumed; saves
    what it holds to rank<r>.pth."""
    folder, rank = Path(folder), comm.get_rank()
    gradients = first_step_gradients(folder / "split")
    second_order = first_step_gradients(folder / "second", *SECOND_ORDER)
    writes, write = [], fad_search.write_genotype_file
    fad_search.write_genotype_file = lambda path, *genotypes: (writes.append(Path(path).name),
                                                               write(path, *genotypes))
    straight = fad_search.Search(tiny_cfg(folder / "straight"))
    straight.run()
    fad_search.write_genotype_file = write
    interrupted = fad_search.Search(tiny_cfg(folder / "resumed"))
    interrupted.step(0)
    interrupted.record(1)
    interrupted.save(1)
    comm.synchronize()  # the main worker has written the checkpoint
    resumed = fad_search.Search(tiny_cfg(folder / "resumed"))
    assert resumed.resume() and resumed.start_iter == 1
    resumed.run()
    torch.save({"gradients": gradients, "second_order": second_order, "straight": final_state(straight),
                "resumed": final_state(resumed), "writes": writes,
                "history": straight.history}, folder / f"rank{rank}.pth")


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    if torch.cuda.is_available():
        pytest.skip("CPU workers are spawned only where CUDA is not available")
    folder = tmp_path_factory.mktemp("fad_ddp")
    launch(search_worker, 2, dist_url="auto", args=(str(folder),))
    return folder, [torch.load(folder / f"rank{r}.pth") for r in range(2)]


def test_both_workers_hold_the_same_weights_alphas_and_buffers(workers):
    _, ranks = workers
    for run in ("straight", "resumed"):
        first, second = ranks[0][run], ranks[1][run]
        assert first.keys() == second.keys()
        assert sum("alphas_" in k for k in first) == 6  # 3 nodes a tower
        assert any(k.endswith("running_mean") for k in first)  # BatchNorm's, averaged
        for key in first:
            assert torch.equal(first[key], second[key]), (run, key)


def test_only_the_main_worker_writes_the_genotype_files(workers):
    folder, ranks = workers
    # iteration 1 (GENOTYPE_PERIOD) and the end (2), each as .log and .yaml
    assert ranks[0]["writes"] == ["genotype.log", "genotype.yaml"] * 2
    assert ranks[1]["writes"] == []
    assert [h["iteration"] for h in ranks[1]["history"]] == [1, 2]  # noted everywhere
    box, cls = read_genotype_file(folder / "straight" / "genotype.log")
    assert box.num_nodes == cls.num_nodes == 3
    assert (folder / "straight" / "alphas.png").stat().st_size > 0


def test_two_workers_resume_exactly(workers):
    _, ranks = workers
    straight, resumed = ranks[0]["straight"], ranks[0]["resumed"]
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key


def assert_same_gradients(got, expected, steps):
    """``steps``: (name, absolute tolerance as a fraction of the step's whole gradient)."""
    assert len(got) == len(expected) == len(steps)
    for (name, noise), got_step, expected_step in zip(steps, got, expected):
        assert len(got_step) == len(expected_step) > 0
        whole = torch.cat([g.flatten() for g in expected_step]).norm()
        for g, e in zip(got_step, expected_step):
            # float32 noise of a sum split in two; a gradient that is zero in exact
            # arithmetic (a bias before GroupNorm: ~1e-8 of the whole) is all noise
            assert (g - e).norm() <= 1e-5 * e.norm() + noise * whole, name


@pytest.mark.parametrize("order", ["gradients", "second_order"])
def test_two_workers_with_one_image_average_the_gradients_of_one_worker_with_two(
        workers, tmp_path, order):
    _, ranks = workers
    if order == "gradients":
        # float32 noise of one batch of two against two of one: within 1e-6 of the whole on
        # a CPU with native bf16; on an AVX2-only one, whose float32 kernels differ, up to
        # 1.1e-3 (alphas) and 2.2e-5 (weights, second order). Averaging wrongly would be off
        # by a third or more.
        expected, steps = first_step_gradients(tmp_path), [("alphas", 3e-3), ("weights", 1e-4)]
    else:
        expected = first_step_gradients(tmp_path, *SECOND_ORDER)
        # The alphas' gradient holds the finite-difference HVP (here ~5% of it), whose
        # central difference of two float32 gradients turns their noise into ~1e-4 of the
        # whole (1/9 of this bound); each worker's HVP along its own, unaveraged
        # dL_val/dw' was measured at 3x the bound.
        steps = [("virtual step", 1e-4), ("dL_val/dw'", 1e-4), ("alphas", 3e-3),
                 ("weights", 1e-4)]  # (AVX2-only CPUs: see above)
    for rank in ranks:
        assert_same_gradients(rank[order], expected, steps)
    assert all(torch.equal(a, b) for s0, s1 in zip(ranks[0][order], ranks[1][order])
               for a, b in zip(s0, s1))  # the same average on both workers


def test_the_module_entry_runs_one_worker_and_names_the_launching_script():
    with pytest.raises(SystemExit, match="tools/fad_search.py"):
        fad_search.run_from_command_line(
            ["--num-gpus", "2", "--config-file", "configs/FAD/FAD-tiny-search.yaml"])
