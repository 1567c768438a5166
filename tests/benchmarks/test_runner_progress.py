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


def _metric_printer_message(iteration: int, max_iter: int, seconds: float) -> str:
    """What detectron2's CommonMetricPrinter logs after `iteration` (the library trainer's
    line, which benchmarks.epochs' children write)."""
    import logging

    from detectron2.utils.events import CommonMetricPrinter, EventStorage

    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("detectron2.utils.events")
    logger.addHandler(handler)
    old_level, logger.level = logger.level, logging.INFO
    try:
        with EventStorage(start_iter=iteration) as storage:
            storage.put_scalar("time", seconds)
            storage.put_scalar("total_loss", 1.25)
            CommonMetricPrinter(max_iter).write()
    finally:
        logger.removeHandler(handler)
        logger.level = old_level
    (message,) = messages
    return message


def test_a_child_without_the_hook_shows_the_metric_printers_iteration_and_eta(tmp_path):
    message = _metric_printer_message(199, 400, 0.5)  # ETA: 0.5 s x 200 iterations to go
    (tmp_path / "log-e12-0.txt").write_text(
        "[12/07 22:10:00 d2.engine.train_loop]: Starting training from iteration 0\n"
        f"[12/07 22:10:01 d2.utils.events]: {_metric_printer_message(19, 400, 0.5)}\n"
        f"[12/07 22:11:40 d2.utils.events]: {message}\n"
        "[12/07 22:11:41 d2.engine.hooks]: not a progress line\n")
    status = runner._children_status([("e12", 0, None, 0.0)], tmp_path)
    assert status == "e12 seed 0 at iteration 200, ETA 0:01:40"


def test_the_hooks_line_wins_over_a_metric_printers_and_a_child_without_either_is_left_out(
        tmp_path):
    (tmp_path / "log-fad_paper-1.txt").write_text(
        "training: 7/10 iterations (70%), 4 s elapsed, ETA 2 s, loss=0.8\n"
        f"[12/07 22:11:40 d2.utils.events]: {_metric_printer_message(8, 10, 0.5)}\n")
    (tmp_path / "log-e12-0.txt").write_text("Command Line Args: ...\n")
    running = [("fad paper", 1, None, 0.0), ("e12", 0, None, 0.0), ("e24", 0, None, 0.0)]
    assert runner._children_status(running, tmp_path) == \
        "fad paper seed 1 at 7/10 iterations (70%), ETA 2 s"
