"""Where a benchmark's children are: each child's training writes its iterations, ETA and
total loss to its log (``benchmarks.runner.iteration_progress``), and ``run_all`` shows
them in its own progress line, so that a run of hours tells its iteration."""
import sys
from types import SimpleNamespace

from benchmarks import runner


class _Storage:
    def __init__(self, latest):
        self._latest = latest

    def latest(self):
        return self._latest


def test_a_childs_hook_writes_its_iterations_eta_and_the_trainers_total_loss(monkeypatch,
                                                                              capsys):
    monkeypatch.setenv("FCOS_D2_PROGRESS", "0")  # a line at every update
    hook = runner.iteration_progress()
    hook.trainer = SimpleNamespace(max_iter=10, start_iter=2, storage=_Storage(
        {"total_loss": (0.4123, 3), "loss_cls": (0.3, 3), "lr": (0.01, 3)}))
    hook.before_train()
    hook.after_step()
    hook.after_train()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("training: 3/10 iterations (30%), ")
    assert "ETA " in lines[0] and lines[0].endswith("loss=0.412")  # the sum, once


def test_a_step_without_a_total_loss_shows_none(monkeypatch, capsys):
    monkeypatch.setenv("FCOS_D2_PROGRESS", "0")
    hook = runner.iteration_progress()
    hook.trainer = SimpleNamespace(max_iter=4, start_iter=0, storage=_Storage({}))
    hook.before_train()
    hook.after_step()
    assert "loss=" not in capsys.readouterr().err


def test_the_runner_shows_where_each_running_child_is_and_none_at_the_end(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FCOS_D2_PROGRESS", "0")
    monkeypatch.setattr(runner, "CHILD_LOOK_SECONDS", 0.0)
    child = tmp_path / "child.py"
    child.write_text(  # two progress lines, the latest one counts; then a while running
        "import sys, time\n"
        "print('training: 5/10 iterations (50%), 3 s elapsed, ETA 3 s, loss=0.9', "
        "file=sys.stderr, flush=True)\n"
        "print('training: 7/10 iterations (70%), 4 s elapsed, ETA 2 s, loss=0.8', "
        "file=sys.stderr, flush=True)\n"
        "print('not a progress line', flush=True)\n"
        "time.sleep(2.5)\n")
    runner.run_all([("fad paper", 1)], 1, tmp_path, [], [sys.executable, str(child)])
    err = capsys.readouterr().err
    assert "running=fad paper seed 1 at 7/10 iterations (70%), ETA 2 s" in err
    assert "5/10" not in err
    assert err.splitlines()[-1].endswith("running=-")


def test_a_child_without_progress_lines_yet_shows_a_dash(tmp_path):
    (tmp_path / "log-fad_paper-1.txt").write_text("loading the data\n")
    running = [("fad paper", 1, None, 0.0), ("fcos-d2 recipe", 2, None, 0.0)]
    assert runner._children_status(running, tmp_path) == "-"  # the second has no log yet
