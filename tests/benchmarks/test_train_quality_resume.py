"""A benchmark run killed after a save resumes from its run folder and ends as the same
run uninterrupted: bit-equal weights, the same losses, its record saying where it resumed."""
import pytest
import torch

from benchmarks.train_quality import cli, contenders as cn, protocol, resume
from test_train_quality import _cfg, _toy_dataset


class _Killed(Exception):
    """What a kill is to the run: nothing after it happens."""


def _tiny(tmp_path, name):
    _toy_dataset(tmp_path, name)
    return _cfg(cn.RECIPE, "DATASETS.TRAIN", (name,), "SOLVER.MAX_ITER", 6,
                "SOLVER.STEPS", (4,), "SOLVER.WARMUP_ITERS", 2, "SOLVER.IMS_PER_BATCH", 2,
                "INPUT.MIN_SIZE_TRAIN", (64,), "INPUT.MAX_SIZE_TRAIN", 64,
                "MODEL.RESNETS.DEPTH", 18, "MODEL.RESNETS.RES2_OUT_CHANNELS", 64)


def test_a_run_killed_after_a_save_resumes_and_ends_bit_equal_to_an_uninterrupted_one(
        tmp_path, monkeypatch):
    cfg = _tiny(tmp_path, "train_quality_resume_toy")
    build = cn.FcosD2Contender(cn.RECIPE).build
    plain, plain_record = protocol.train(build, cfg, seed=0)
    folder = tmp_path / "run"
    saved = []
    save = resume.RunCheckpoint.save

    def save_then_kill_after_the_third(hook):
        save(hook)
        saved.append(hook.trainer.iter)
        if hook.trainer.iter == 2:
            raise _Killed

    monkeypatch.setattr(resume, "CHECKPOINT_SECONDS", 0.0)  # a save after every iteration
    monkeypatch.setattr(resume.RunCheckpoint, "save", save_then_kill_after_the_third)
    with pytest.raises(_Killed):
        protocol.train(build, cfg, seed=0, checkpoint_dir=str(folder))
    assert saved == [0, 1, 2] and (folder / resume.RESUME_FILE).is_file()
    monkeypatch.setattr(resume.RunCheckpoint, "save", save)
    resumed, record = protocol.train(build, cfg, seed=0, checkpoint_dir=str(folder))
    assert record["resumed"] == [{"from_iteration": 3, "exact": True}]
    assert record["iterations"] == 6 and record["final_losses"] == plain_record["final_losses"]
    for (key, a), b in zip(plain.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), key
    assert "resumed" not in plain_record


def test_a_saved_state_of_another_config_or_unreadable_is_refused_by_name(tmp_path):
    path = tmp_path / resume.RESUME_FILE
    torch.save({"config": "SEED: 1\n"}, path)
    with pytest.raises(SystemExit, match=f"{path}: saved by a run of another config"):
        resume.resume_state(path, "SEED: 2\n")
    assert resume.resume_state(tmp_path / "none.pth", "SEED: 2\n") is None
    path.write_bytes(b"not a saved run")
    with pytest.raises(SystemExit, match=f"{path}: cannot be read as a saved run"):
        resume.resume_state(path, "SEED: 2\n")


def test_a_recorded_run_leaves_no_saved_state_behind(tmp_path, monkeypatch):
    folder = tmp_path / "runs" / "fcos-d2 recipe-0"

    def run_one(name, seed, output_dir, opts, **_):
        (folder / resume.RESUME_FILE).write_bytes(b"state of a killed attempt")
        return [{"contender": name, "seed": seed, "AP": 1.0, "AP50": 2.0, "status": "ok"}]

    folder.mkdir(parents=True)
    recorded = []
    monkeypatch.setattr(cli, "run_one", run_one)
    monkeypatch.setattr(cli.records, "append_record", recorded.append)
    args = cli._parser().parse_args(["--run", cn.RECIPE, "--seed", "0"])
    cli.run_child(args, tmp_path, ["--run", cn.RECIPE, "--seed", "0"])
    assert len(recorded) == 1 and not (folder / resume.RESUME_FILE).exists()
