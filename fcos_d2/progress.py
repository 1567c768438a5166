"""Progress of long steps (searches, benchmark runs, dataset generation, downloads): one
helper, so that every step reports alike and a slow step can be told from a hung one.

On an interactive stderr (a TTY) a step shows a tqdm bar: done/total, rate, ETA and its
figures (``best=...``). In a non-interactive log (a file, a pipe, a SLURM job) a bar would
fill it with carriage returns, so the step writes one plain line at most once a minute,
and one when it ends:

    FAD search: 30/100 iterations (30%), 1 min 2 s elapsed, ETA 2 min 25 s, loss=0.4102

``FCOS_D2_PROGRESS`` changes that: ``off`` shows nothing, a number N writes the plain line
at most every N seconds (0: at every update) even on a TTY, ``bar`` forces the bar.

    with Progress(total=len(todo), desc="benchmark runs", unit="runs") as progress:
        for run in todo:
            ...
            progress.update(1, best=f"{ap:.1f}")
"""
import math
import os
import sys
import time
from typing import IO, Any, Dict, Optional

from tqdm import tqdm

__all__ = ["Progress", "format_seconds"]

ENVIRONMENT_VARIABLE = "FCOS_D2_PROGRESS"
DEFAULT_INTERVAL = 60.0  # seconds between two plain lines in a non-interactive log


def format_seconds(seconds: float) -> str:
    """``3725`` -> ``"1 h 2 min"``, ``62.4`` -> ``"1 min 2 s"``, ``5.2`` -> ``"5 s"``."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def _mode(stream: IO) -> Any:
    """"off", "bar", or the seconds between plain lines, from FCOS_D2_PROGRESS and
    whether ``stream`` is a TTY."""
    value = os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower()
    if value in ("off", "bar"):
        return value
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            raise ValueError(f"{ENVIRONMENT_VARIABLE}={value!r}: use 'off', 'bar' or a number "
                             "of seconds between progress lines") from None
    return "bar" if getattr(stream, "isatty", lambda: False)() else DEFAULT_INTERVAL


class Progress:
    """Progress of a step of ``total`` units (see the module docstring).

    Args:
        total: units the step will do (0 or less: unknown, no ETA).
        desc: what the step is, e.g. "NAS-FCOS search".
        unit: what is counted, e.g. "samples"; "B" shows bytes as KiB/MiB/GiB.
        initial: units already done (a resumed step); the ETA counts from the units done
            here.
        enabled: False shows nothing (e.g. on workers other than the main one).
        stream: where to write; default stderr.
    """

    def __init__(self, total: int, desc: str, unit: str = "it", *, initial: int = 0,
                 enabled: bool = True, stream: Optional[IO] = None):
        self.total, self.desc, self.unit = total, desc, unit
        self.done, self._initial = initial, initial
        self._stream = stream or sys.stderr
        self._mode = _mode(self._stream) if enabled else "off"
        self._started = self._last_line = time.monotonic()
        self._figures: Dict[str, Any] = {}
        self._written: Any = None  # (done, figures) of the last plain line
        self._bar = None
        if self._mode == "bar":
            self._bar = tqdm(total=total if total > 0 else None, desc=desc, unit=unit,
                             initial=initial, file=self._stream, dynamic_ncols=True,
                             unit_scale=unit == "B", unit_divisor=1024 if unit == "B" else 1000)

    def update(self, count: int = 1, **figures: Any) -> None:
        """``count`` more units done; ``figures`` (e.g. ``best="0.43"``) are shown from now."""
        self.done += count
        self._figures.update(figures)
        if self._bar is not None:
            if figures:
                self._bar.set_postfix(self._figures, refresh=False)
            self._bar.update(count)
        elif self._mode != "off" and self._last_line is not None and \
                time.monotonic() - self._last_line >= self._mode:
            self._write_line()

    def status(self) -> str:
        """``"<desc>: done/total unit (p%), T elapsed, ETA T, figures"``."""
        elapsed = time.monotonic() - self._started
        unit = "" if self.unit == "B" else f" {self.unit}"  # bytes: KiB, MiB, ... instead
        parts = [f"{self.desc}: {self._count(self.done)}"]
        if self.total > 0:
            parts[0] += f"/{self._count(self.total)}{unit} " \
                        f"({100.0 * self.done / self.total:.0f}%)"
        else:
            parts[0] += unit
        parts.append(f"{format_seconds(elapsed)} elapsed")
        eta = self.eta_seconds()
        if eta is not None:
            parts.append(f"ETA {format_seconds(eta)}")
        parts += [f"{key}={value}" for key, value in self._figures.items()]
        return ", ".join(parts)

    def eta_seconds(self) -> Optional[float]:
        """Seconds to go at the rate of the units done here; None before the first."""
        done_here = self.done - self._initial
        if self.total <= 0 or done_here <= 0:
            return None
        rate = (time.monotonic() - self._started) / done_here
        return max(0.0, rate * (self.total - self.done))

    def close(self) -> None:
        """Ends the bar, or writes the last plain line."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._mode != "off" and self._last_line is not None:
            if self._written != (self.done, self._figures):  # not written just before
                self._write_line()
            self._last_line = None  # closed: nothing more

    def _write_line(self) -> None:
        print(self.status(), file=self._stream, flush=True)
        self._last_line = time.monotonic()
        self._written = (self.done, dict(self._figures))

    def _count(self, value: float) -> str:
        if self.unit != "B":
            return str(value)
        exponent = min(3, int(math.log(max(value, 1), 1024)))
        return f"{value / 1024 ** exponent:.1f} {['B', 'KiB', 'MiB', 'GiB'][exponent]}"

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *error: Any) -> None:
        self.close()
