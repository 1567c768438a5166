"""Runs ``train_net.py`` (or another script) in processes forked from one server that
has imported it once.

Starting a Python process that imports torch and detectron2 costs seconds of CPU; the
fault tests run about ten trainings. The server (this file, run as a script) imports
everything ``train_net.py`` needs and never computes anything (so forking it is safe);
each training is a fork that runs ``train_net.py`` as ``__main__`` with its own argv,
stdout and stderr going to a log file. A training can be given faults: die by SIGKILL
when iteration ``kill_at`` starts, or get a NaN classification loss at ``nan_at``; and
``record`` appends, per iteration, the image ids the model was given to a JSON-lines file.
Cluster faults: ``signals`` {iteration: signal name} sends that signal to the training
itself when the iteration starts (SIGTERM, SIGSTOP, ...), after ``busy`` {iteration:
seconds} has kept its main thread busy (a slow step); ``signal_during_save`` {checkpoint
name: signal name} sends a signal while that checkpoint is written; ``env`` adds
environment variables (a faked SLURM step).

``TrainingProcesses`` is the pytest side: ``start`` a training, ``wait`` for it, or ``run``
a script (``run_module`` a module, as ``python -m``) to its end as ``subprocess.run`` would
(stdout and stderr kept apart). The
``scripts`` fixture of tests/conftest.py is one server per pytest worker, for every test
that runs a script of this repository (train_net.py, tools/, demo/) in one process.
"""
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]


class TrainingProcesses:
    """A client of the server: one instance per test module; ``close()`` at the end."""

    def __init__(self):
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
        self._server = subprocess.Popen([sys.executable, __file__], cwd=REPO, env=env, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._running = set()  # started, not waited for

    def _ask(self, request: dict) -> dict:
        self._server.stdin.write(json.dumps(request) + "\n")
        self._server.stdin.flush()
        reply = self._server.stdout.readline()
        if not reply:
            raise RuntimeError(f"the training server stopped (status {self._server.wait()})")
        return json.loads(reply)

    def start(self, argv: List[str], log: Path, kill_at: Optional[int] = None,
              nan_at: Optional[int] = None, record: Optional[Path] = None,
              script: Path = REPO / "train_net.py", signals: Optional[dict] = None,
              busy: Optional[dict] = None, signal_during_save: Optional[dict] = None,
              env: Optional[dict] = None, stderr: Optional[Path] = None,
              module: Optional[str] = None) -> int:
        """Starts ``script *argv`` (train_net.py by default), or ``python -m module *argv``
        where `module` is given; returns its process id. Its stdout and stderr go to `log`,
        or stderr to `stderr` where that is given."""
        faults = {"kill_at": kill_at, "nan_at": nan_at, "record": record and str(record),
                  "signals": signals or {}, "busy": busy or {},
                  "signal_during_save": signal_during_save or {}, "env": env or {}}
        pid = self._ask({"op": "start", "argv": argv, "log": str(log), "script": str(script),
                         "stderr": stderr and str(stderr), "module": module, **faults})["pid"]
        self._running.add(pid)
        return pid

    def wait(self, pid: int, timeout: float = 300) -> Tuple[int, float]:
        """(exit status, or minus the signal that ended it; time.time() when it ended)."""
        reply = self._wait_reply(pid, timeout)
        return reply["returncode"], reply["ended_at"]

    def _wait_reply(self, pid: int, timeout: float) -> dict:
        """The server's reply to a wait: also "timed_out" where it killed the process."""
        reply = self._ask({"op": "wait", "pid": pid, "timeout": timeout})
        self._running.discard(pid)
        return reply

    def run(self, script: str, *argv: str, timeout: float = 300,
            env: Optional[dict] = None) -> subprocess.CompletedProcess:
        """``python script *argv`` from the repository's root, as ``subprocess.run`` with
        ``capture_output=True, text=True`` gives it; `script` is relative to the root.
        Raises subprocess.TimeoutExpired (the process killed) after `timeout` seconds."""
        return self._run([sys.executable, script, *argv], timeout, argv=list(argv),
                         script=REPO / script, env=env)

    def run_module(self, module: str, *argv: str, timeout: float = 300,
                   env: Optional[dict] = None) -> subprocess.CompletedProcess:
        """``python -m module *argv`` from the repository's root (``benchmarks.tables``, ...),
        as ``run`` runs a script."""
        return self._run([sys.executable, "-m", module, *argv], timeout, argv=list(argv),
                         module=module, env=env)

    def _run(self, command: List[str], timeout: float, **start) -> subprocess.CompletedProcess:
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            pid = self.start(log=out, stderr=err, **start)
            reply = self._wait_reply(pid, timeout)
            stdout, stderr = out.read_text(), err.read_text()
        if reply.get("timed_out"):
            raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
        return subprocess.CompletedProcess(command, reply["returncode"], stdout, stderr)

    def stop_running(self) -> None:
        """Kills the trainings not waited for (a test failed)."""
        for pid in list(self._running):
            self.wait(pid, timeout=0)

    def close(self) -> None:
        """Ends the server, and the trainings not waited for."""
        self.stop_running()
        self._server.stdin.close()
        self._server.kill()
        self._server.wait()


def _install_faults(kill_at: Optional[int], nan_at: Optional[int], record: Optional[str],
                    signals: dict, busy: dict, signal_during_save: dict):
    from fcos_d2.checkpoint import FCOSCheckpointer
    from fcos_d2.modeling.labelenc import LabelEncStep1, LabelEncStep2
    from fcos_d2.modeling.meta_arch import FCOS

    save = FCOSCheckpointer.save

    def save_with_signal(self, name, **kwargs):
        if name in signal_during_save:
            os.kill(os.getpid(), signal.Signals[signal_during_save[name]])
        return save(self, name, **kwargs)

    for model_class in (FCOS, LabelEncStep1, LabelEncStep2):  # each has its own forward
        model_class.forward = _with_faults(model_class.forward, kill_at, nan_at, record,
                                           signals, busy)
    FCOSCheckpointer.save = save_with_signal


def _with_faults(forward, kill_at: Optional[int], nan_at: Optional[int], record: Optional[str],
                 signals: dict, busy: dict):
    from detectron2.utils.events import get_event_storage

    def forward_with_faults(self, batched_inputs):
        if not self.training:
            return forward(self, batched_inputs)
        iteration = get_event_storage().iter
        if record:
            with open(record, "a") as f:
                ids = [d["image_id"] for d in batched_inputs]
                f.write(json.dumps({"iteration": iteration, "image_ids": ids}) + "\n")
        if iteration == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        started = time.time()
        while time.time() - started < busy.get(str(iteration), 0):
            pass  # busy in Python, holding the GIL as much as it is allowed to
        if str(iteration) in signals:
            os.kill(os.getpid(), signal.Signals[signals[str(iteration)]])
        losses = forward(self, batched_inputs)
        if iteration == nan_at:
            losses["loss_fcos_cls"] = losses["loss_fcos_cls"] * float("nan")
        return losses

    return forward_with_faults


def _run_child(request: dict) -> None:
    """The body of a forked training; never returns."""
    status = 1
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        err = request.get("stderr")
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(log, 1)
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_APPEND) if err else log, 2)
        os.environ.update(request["env"])
        _install_faults(request["kill_at"], request["nan_at"], request["record"],
                        request["signals"], request["busy"], request["signal_during_save"])
        if request.get("module"):
            sys.argv = [request["module"], *request["argv"]]
            sys.path[0] = str(REPO)  # as `python -m` from the repository's root has it
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            sys.argv = [request["script"], *request["argv"]]
            sys.path[0] = str(Path(request["script"]).parent)  # as `python script` has it
            runpy.run_path(request["script"], run_name="__main__")
        status = 0
    except SystemExit as exit:  # as the interpreter ends on it: a message goes to stderr
        status = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
        if exit.code is not None and not isinstance(exit.code, int):
            print(exit.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _wait(pid: int, timeout: float) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"returncode": os.waitstatus_to_exitcode(status), "ended_at": time.time()}
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return {"returncode": -signal.SIGKILL, "ended_at": time.time(), "timed_out": True}


def _serve() -> None:
    import fcos_d2.engine.trainer  # noqa: F401  (torch, detectron2, fcos_d2 once, for all forks)

    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "start":
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _run_child(request)
            reply = {"pid": pid}
        else:
            reply = _wait(request["pid"], request["timeout"])
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    _serve()
