"""Progress of long steps (fcos_d2.progress): the helper, and the steps that use it: the
NAS-FCOS search, the benchmark runs and the first-use generation of a built-in dataset.

pytest's stderr is not a TTY, so the steps write plain lines; FCOS_D2_PROGRESS=0 makes
them write one at every update instead of one a minute."""
import io
import json
import re
import sys

import pytest

from fcos_d2.progress import Progress, format_seconds


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def every_update(monkeypatch):
    monkeypatch.setenv("FCOS_D2_PROGRESS", "0")


def test_seconds_read_as_hours_minutes_and_seconds():
    assert format_seconds(5.2) == "5 s"
    assert format_seconds(62.4) == "1 min 2 s"
    assert format_seconds(3725) == "1 h 2 min"


def test_a_log_gets_plain_lines_with_the_count_eta_and_figures(every_update):
    stream = io.StringIO()
    with Progress(4, "demo search", "samples", initial=1, stream=stream) as progress:
        progress.update(1, best="0.5")
        progress.update(2, best="0.7")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2  # the last update's line is not written twice at the end
    assert re.fullmatch(r"demo search: 2/4 samples \(50%\), \d+ s elapsed, ETA \d+ s, "
                        r"best=0\.5", lines[0])
    assert lines[1].startswith("demo search: 4/4 samples (100%)") and "best=0.7" in lines[1]


def test_by_default_a_log_gets_one_line_a_minute_and_one_at_the_end(monkeypatch):
    monkeypatch.delenv("FCOS_D2_PROGRESS", raising=False)
    stream = io.StringIO()
    with Progress(1000, "steps", stream=stream) as progress:
        for _ in range(1000):  # far less than a minute
            progress.update(1)
    assert stream.getvalue().count("\n") == 1
    assert stream.getvalue().startswith("steps: 1000/1000 it (100%)")


def test_a_terminal_gets_a_bar_and_off_or_another_worker_gets_nothing(monkeypatch):
    monkeypatch.delenv("FCOS_D2_PROGRESS", raising=False)
    terminal = FakeTTY()
    with Progress(3, "bar", "runs", stream=terminal) as progress:
        progress.update(2, best="1.0")
    assert "2/3" in terminal.getvalue() and "\r" in terminal.getvalue()  # tqdm's bar
    quiet = io.StringIO()
    with Progress(3, "rank 1", stream=quiet, enabled=False) as progress:
        progress.update(3)
    monkeypatch.setenv("FCOS_D2_PROGRESS", "off")
    with Progress(3, "off", stream=quiet) as progress:
        progress.update(3)
    assert quiet.getvalue() == ""
    monkeypatch.setenv("FCOS_D2_PROGRESS", "sometimes")
    with pytest.raises(ValueError, match="FCOS_D2_PROGRESS='sometimes'"):
        Progress(3, "bad")


def test_bytes_read_in_kib_mib_gib(every_update):
    stream = io.StringIO()
    with Progress(3 * 1024 ** 2, "downloading w.pth", "B", stream=stream) as progress:
        progress.update(1024 ** 2)
    assert stream.getvalue().startswith("downloading w.pth: 1.0 MiB/3.0 MiB (33%)")


def test_the_nas_fcos_search_reports_samples_eta_and_the_best_reward(every_update, tmp_path,
                                                                      capsys):
    from detectron2.config import get_cfg

    from fcos_d2 import add_fcos_config
    from fcos_d2.modeling.nas_fcos.search.loop import run_search

    class Proxy:  # rewards by sample index; the loop is what is tested
        cfg = get_cfg()
        add_fcos_config(cfg)

        def reward(self, fpn, head, seed=0):
            return [0.1, 0.5, 0.3][seed]

    run_search(Proxy(), tmp_path, fpn_samples=3, head_samples=1, num_cells=3, head_layers=2)
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.startswith("NAS-FCOS search")]
    assert len(lines) == 4, lines
    assert lines[0].startswith("NAS-FCOS search: 1/4 samples (25%)")
    assert "ETA" in lines[0] and lines[0].endswith("best=0.1000 (fpn sample 0)")
    assert lines[2].endswith("best=0.5000 (fpn sample 1)")  # the best so far, not the last
    assert lines[3].startswith("NAS-FCOS search: 4/4 samples (100%)")


def test_benchmark_runs_report_the_runs_done_and_to_go(every_update, tmp_path, capsys):
    from benchmarks.runner import run_all

    command = [sys.executable, "-c", "pass"]  # a run that ignores its arguments
    run_all([("a", 0), ("b", 0), ("b", 1)], 1, tmp_path, [], command)
    captured = capsys.readouterr()
    finished = [line for line in captured.out.splitlines() if line.startswith("finished")]
    assert [line.split(";")[1].split(", ETA")[0] for line in finished] == [
        " 1 runs done, 2 to go", " 2 runs done, 1 to go", " 3 runs done, 0 to go"]
    assert "ETA" in finished[0]
    assert "benchmark runs: 3/3 runs (100%)" in captured.err


def test_first_use_generation_of_a_dataset_reports_the_images(every_update, tmp_path, capsys):
    from fcos_d2.data.synthetic import ensure_synthetic_shapes

    folder = ensure_synthetic_shapes("val", root=tmp_path, num_images=3)
    assert len(json.loads((folder / "annotations.json").read_text())["images"]) == 3
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] + "," + line.split(",")[1] for line in lines] == [
        f"synthetic shapes, val split: generating (first use): {n}/3 images ({p}%)"
        for n, p in ((1, 33), (2, 67), (3, 100))]
    ensure_synthetic_shapes("val", root=tmp_path, num_images=3)  # cached: nothing to report
    assert capsys.readouterr().err == ""
