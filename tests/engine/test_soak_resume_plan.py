"""The pieces of tools/soak_resume.py (the soak itself is not in the test suite): the
seed -> plan mapping, the checkpoints a run writes, the weight comparison, the summary."""
import importlib.util
import os
from pathlib import Path

import torch

TOOL = Path(__file__).resolve().parents[2] / "tools" / "soak_resume.py"
spec = importlib.util.spec_from_file_location("soak_resume", TOOL)
soak = importlib.util.module_from_spec(spec)
spec.loader.exec_module(soak)


def test_a_run_of_40_iterations_every_10_writes_four_periodic_checkpoints_then_the_final():
    assert soak.checkpoint_names(40, 10) == [
        "model_0000009.pth", "model_0000019.pth", "model_0000029.pth", "model_0000039.pth",
        "model_final.pth"]


def test_a_seed_gives_the_same_plan_every_time_and_picks_the_variant_by_its_remainder():
    assert soak.plan_for(17, 40, 10) == soak.plan_for(17, 40, 10)
    assert [soak.plan_for(s, 40, 10).variant for s in range(4)] == [
        "plain", "loader-workers-2", "training-workers-2", "plain"]


def test_plans_aim_a_share_of_kills_inside_checkpoint_writes_that_a_run_performs():
    plans = [soak.plan_for(seed, 40, 10) for seed in range(400)]
    aimed = [p.kills[0].pause for p in plans if p.kills[0].pause is not None]
    assert 0.3 < len(aimed) / len(plans) < 0.5  # AIMED_SHARE 0.4
    names = soak.checkpoint_names(40, 10)
    for pause in aimed:
        stage, name, count = pause.split(":")
        assert stage in ("written", "renamed")
        # each checkpoint is written once; last_checkpoint once after each of the 5 saves
        assert (name in names and count == "1") or (
            name == "last_checkpoint" and 1 <= int(count) <= len(names))
    # the window of issue 53 (last_checkpoint names model_0000039, no model_final yet)
    assert "written:model_final.pth:1" in aimed and "renamed:last_checkpoint:4" in aimed
    timed = [k.fraction for p in plans for k in p.kills if k.pause is None]
    assert all(0 <= f < 1 for f in timed) and max(len(p.kills) for p in plans) == 3


def save_model(path: Path, **tensors) -> None:
    torch.save({"model": tensors, "iteration": 3}, path)


def test_weights_are_compared_bit_for_bit_and_each_failure_has_its_kind(tmp_path):
    reference = tmp_path / "reference.pth"
    save_model(reference, w=torch.tensor([1.0, 2.0]), b=torch.tensor([0.5]))
    save_model(tmp_path / "same.pth", w=torch.tensor([1.0, 2.0]), b=torch.tensor([0.5]))
    save_model(tmp_path / "ulp.pth", w=torch.tensor([1.0, 2.0]),
               b=torch.nextafter(torch.tensor([0.5]), torch.tensor([1.0])))
    save_model(tmp_path / "fewer.pth", w=torch.tensor([1.0, 2.0]))
    save_model(tmp_path / "truncated.pth", w=torch.tensor([1.0, 2.0]), b=torch.tensor([0.5]))
    os.truncate(tmp_path / "truncated.pth", 100)
    assert soak.same_weights(tmp_path / "same.pth", reference) is None
    assert soak.same_weights(tmp_path / "ulp.pth", reference) == "weights-differ"
    assert soak.same_weights(tmp_path / "fewer.pth", reference) == "weights-differ"
    assert soak.same_weights(tmp_path / "truncated.pth", reference) == "unreadable-final"
    assert soak.same_weights(tmp_path / "absent.pth", reference) == "missing-final"


def test_the_summary_counts_tries_exact_ones_per_variant_kills_and_failures_by_kind():
    aimed = soak.Plan(1, "loader-workers-2", (soak.Kill(pause="written:x:1"),), hog=True)
    timed = soak.Plan(3, "plain", (soak.Kill(fraction=0.5), soak.Kill(fraction=0.2)), hog=False)
    results = [soak.Result(aimed, kills_landed=1, aimed_landed=True),
               soak.Result(timed, failure="missing-final", kills_landed=2),
               soak.Result(timed, failure="missing-final", kills_landed=0),
               soak.Result(timed, failure="weights-differ", kills_landed=1)]
    assert soak.summary(results) == (
        "soak_resume: 4 tries, 1 exact (plain 0/3, loader-workers-2 1/1); failures: "
        "missing-final 2, weights-differ 1; kills landed 4 (1 inside checkpoint writes), "
        "1 tries beside a CPU hog")
