"""Heartbeat: ends the whole job when a worker stalls, long before ``--dist-timeout``.

A worker that hangs without closing its sockets (a frozen machine, ``kill -STOP``, a lost
network link) keeps the others waiting in a collective until ``--dist-timeout`` (30
minutes by default). So every worker of a multi-worker job runs a daemon thread that
beats over a side channel, UDP datagrams, never the training collectives:

* each worker r > 0 sends rank 0 a beat every ``period`` seconds, and when its progress
  changes (at most every 0.1 s): its rank, host, pid and the progress ``ReportProgress``
  records (phase and iteration); rank 0 answers each with its own beat;
* **stalled** means: no beat from that worker for ``timeout`` seconds (``--stall-timeout``).
  The thread beats whatever the main thread does, so slow but alive work (a long first
  iteration, a long evaluation, a checkpoint save, waiting in a collective) is progress;
  a stopped process stops all its threads, and a frozen machine or a cut link delivers
  no beat;
* rank 0 notices a stalled worker r > 0, logs the error naming it and its last iteration,
  passes the verdict on to the other workers with its answers and exits with
  ``STALLED_EXIT_CODE`` (76); they exit with it too. A worker that hears nothing from
  rank 0 for ``timeout`` seconds names rank 0 and exits the same way.
* Workers that finish say so, and are not watched any more. A worker from which no beat
  at all has arrived is not judged (UDP may be blocked between the machines): a warning
  says that stall detection is off for it.

Time is measured by each process on its own monotonic clock, so clocks of different
machines need not agree. Not caught by the heartbeat: a main thread stuck while its
process still runs (e.g. a read from a hung file system in one thread); there
``--dist-timeout`` still applies.
"""
import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Any, Dict, Optional, Tuple

from detectron2.engine import HookBase
from detectron2.utils import comm

__all__ = ["STALLED_EXIT_CODE", "Heartbeat", "ReportProgress", "start_heartbeat"]

logger = logging.getLogger(__name__)

STALLED_EXIT_CODE = 76

# What this process reports in its beats (process-wide: one training loop per worker).
_progress: Dict[str, Any] = {"phase": "setup", "iteration": None}


class ReportProgress(HookBase):
    """Puts the training's phase and iteration into this worker's heartbeats."""

    def before_train(self):
        _progress.update(phase="training", iteration=self.trainer.iter)

    def before_step(self):
        _progress["iteration"] = self.trainer.iter

    def after_train(self):
        _progress["phase"] = "after training (final evaluation, writing results)"


Address = Tuple[str, int]


class Heartbeat:
    """The beating and watching thread of one worker (see the module docstring).

    Args:
        rank, world_size: this worker's rank and the number of workers.
        sock: a bound UDP socket (rank 0's is the one the others send to).
        rank0: rank 0's address; None in rank 0.
        timeout: seconds without a beat after which a worker counts as stalled.
        on_stall: called with the message when the job must end; default: log it and
            exit the process with STALLED_EXIT_CODE.
    """

    def __init__(self, *, rank: int, world_size: int, sock: socket.socket,
                 rank0: Optional[Address], timeout: float, on_stall=None):
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.period = min(max(timeout / 6, 0.05), 5.0)
        self._sock, self._rank0 = sock, rank0
        self._on_stall = on_stall or _exit_stalled
        self._stop = threading.Event()
        self._peers: Dict[int, Dict[str, Any]] = {}  # rank -> last beat, address, time seen
        self._verdict: Optional[str] = None
        self._beats = 0
        self._reported: Dict[str, Any] = {}  # the progress in the last beat sent
        self._started = 0.0
        self._warned = False
        self._thread = threading.Thread(target=self._run, name="fcos_d2-heartbeat", daemon=True)

    def start(self) -> "Heartbeat":
        now = self._started = time.monotonic()
        others = range(1, self.world_size) if self.rank == 0 else [0]
        self._peers = {r: {"seen": now, "beat": None, "address": None} for r in others}
        self._thread.start()
        return self

    def stop(self) -> None:
        """This worker finished: tells the others (three times: datagrams can get lost)."""
        self._stop.set()
        self._thread.join()
        for _ in range(3):
            self._send_all(self._beat(done=True))

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.rank != 0:
                self._send(self._beat(), self._rank0)
            self._receive_until(time.monotonic() + self.period)
            stalled = self._stalled_peer()
            if stalled is not None and self._verdict is None:
                self._verdict = self._message(stalled)
                if self.rank == 0:  # let the others hear it with their next beats first
                    self._receive_until(time.monotonic() + 2 * self.period)
                self._on_stall(self._verdict)
                return

    def _beat(self, done: bool = False) -> Dict[str, Any]:
        self._beats += 1
        self._reported = dict(_progress)
        return {"rank": self.rank, "n": self._beats, "host": socket.gethostname(),
                "pid": os.getpid(), "done": done, "verdict": self._verdict, **_progress}

    def _receive_until(self, deadline: float) -> None:
        while (left := deadline - time.monotonic()) > 0 and not self._stop.is_set():
            if self.rank != 0 and self._reported != _progress:
                self._send(self._beat(), self._rank0)
            self._sock.settimeout(min(left, 0.1))  # short: stop() need not wait a period
            try:
                data, address = self._sock.recvfrom(65536)
            except socket.timeout:
                continue
            except OSError:  # e.g. an ICMP error of an earlier datagram: try again
                time.sleep(min(left, 0.1))
                continue
            beat = json.loads(data)
            peer = self._peers.get(beat["rank"])
            if peer is None:
                continue
            peer.update(seen=time.monotonic(), beat=beat, address=address)
            if beat["verdict"] and self.rank != 0 and self._verdict is None:
                self._verdict = beat["verdict"]
                self._on_stall(self._verdict)
                self._stop.set()
                return
            if self.rank == 0 and not beat["done"]:
                self._send(self._beat(), address)

    def _stalled_peer(self) -> Optional[int]:
        now = time.monotonic()
        silent = [rank for rank, peer in self._peers.items() if peer["beat"] is None]
        if silent and now - self._started > self.timeout and not self._warned:
            self._warned = True
            logger.warning(f"no heartbeat at all from worker(s) {silent} in {self.timeout:g} s: "
                           "UDP between the machines blocked? Stall detection is off for "
                           "them (--dist-timeout still applies).")
        for rank, peer in self._peers.items():
            if peer["beat"] is not None and not peer["beat"]["done"] and \
                    now - peer["seen"] > self.timeout:
                return rank
        return None

    def _message(self, rank: int) -> str:
        beat = self._peers[rank]["beat"]
        iteration = beat["iteration"]
        last = (f"its last reported iteration: {iteration} ({beat['phase']})"
                if iteration is not None else f"it had not started training ({beat['phase']})")
        return (f"worker {rank} of {self.world_size} stalled (host {beat['host']}, pid "
                f"{beat['pid']}): no heartbeat for "
                f"{self.timeout:g} s (--stall-timeout); {last}. Reported by worker "
                f"{self.rank}. Ending the whole job (status {STALLED_EXIT_CODE}) instead of "
                f"waiting for --dist-timeout; look at that machine, then restart with "
                f"--resume.")

    def _send(self, beat: Dict[str, Any], address: Optional[Address]) -> None:
        if address is None:
            return
        try:
            self._sock.sendto(json.dumps(beat).encode(), address)
        except OSError:  # e.g. an unreachable host: it shows as missing beats
            pass

    def _send_all(self, beat: Dict[str, Any]) -> None:
        addresses = [self._rank0] if self.rank != 0 else \
            [peer["address"] for peer in self._peers.values()]
        for address in addresses:
            self._send(beat, address)


def _exit_stalled(message: str) -> None:
    """Logs the verdict and ends this process (its main thread may wait in a collective)."""
    logger.error(message)
    print(f"WorkerStalledError: {message}", file=sys.stderr, flush=True)
    for name in ("fcos_d2", "detectron2", ""):
        for handler in logging.getLogger(name).handlers:
            handler.flush()
    os._exit(STALLED_EXIT_CODE)


def start_heartbeat(timeout: float, rank0_host: str) -> Optional[Heartbeat]:
    """Starts this worker's heartbeat (every worker of the job calls it: one all-gather
    tells all rank 0's port). None where it is not needed: one worker, or ``timeout`` 0.

    Args:
        timeout: ``--stall-timeout`` in seconds.
        rank0_host: where the other workers reach rank 0: the rendezvous host.
    """
    world_size = comm.get_world_size()
    if world_size == 1 or timeout <= 0:
        return None
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("", 0))
    ports = comm.all_gather(sock.getsockname()[1])
    rank0 = None if comm.get_rank() == 0 else (socket.gethostbyname(rank0_host), ports[0])
    return Heartbeat(rank=comm.get_rank(), world_size=world_size, sock=sock, rank0=rank0,
                     timeout=timeout).start()
