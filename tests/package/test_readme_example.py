"""The README's "Use from your own project" example runs as printed, in a fresh process,
from a directory outside the repository."""
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEADING = "### Example: FCOS in your own training script"


def readme_example() -> str:
    """The first ```python block after HEADING in README.md."""
    text = (REPO / "README.md").read_text()
    assert HEADING in text, f"README.md has no heading '{HEADING}'"
    block = re.search(r"```python\n(.*?)```", text[text.index(HEADING):], re.S)
    assert block, f"README.md: no ```python block after '{HEADING}'"
    return block.group(1)


def test_readme_example_trains_one_step_and_detects_from_a_fresh_directory(tmp_path):
    script = tmp_path / "my_training_script.py"
    script.write_text(readme_example())
    # fcos-d2 as installed (pip install -e): importable from anywhere, configs found by it.
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    losses, detections = run.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    assert losses == "['loss_fcos_cls', 'loss_fcos_ctr', 'loss_fcos_loc']"
    assert detections.isdigit()  # the number of detections, whatever the random weights
