"""The benchmarks' tests never write records into the repository: every test (and every
process it starts) writes them under its own temporary folder, which ``records_dir`` gives."""
import pytest

from benchmarks.records import RECORDS_DIR_ENV


@pytest.fixture(autouse=True)
def records_dir(tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.mktemp("records")
    monkeypatch.setenv(RECORDS_DIR_ENV, str(folder))
    return folder
