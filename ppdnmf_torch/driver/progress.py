"""An estimator's ``verbose``: progress of one fit through the fit's callback, silent by default.

The CLI shows a run's progress with its own reporter (``app/progress.py``: a tqdm bar on a
terminal, log lines elsewhere). The estimators live below the app, so they report through this
one, which does the same on a smaller scale: ``verbose=0`` says nothing; ``verbose=1`` draws a
tqdm bar when stderr is a terminal and otherwise writes one line every :data:`INTERVAL` seconds
(and at the first and the last iteration); ``verbose>=2`` writes a line after every iteration.
Lines go to stderr (the estimators' user asked for them; the library prints nothing else).

:class:`Eta` is the ETA of both reporters: before two iterations have been timed it uses the
run's own estimate of the time per iteration (a Paillier run's cost estimate, when there is
one), then the measured rate of the latest iterations, which leaves out whatever preceded the
first iteration (key generation, a compilation).
"""
from __future__ import annotations

import collections
import numbers
import sys
import time
import warnings

from ..errors import ConfigError

__all__ = ["FitProgress", "Eta", "check_verbose", "INTERVAL"]

#: seconds between two lines under ``verbose=1`` off a terminal
INTERVAL = 5.0
#: the ETA's rate is measured over at most this many of the latest iterations
_WINDOW = 20


class Eta:
    """Seconds to the last iteration of a run of ``total`` iterations.

    Parameters
    ----------
    total : int
    window : int
        The measured rate is taken over at most this many of the latest iterations.
    seconds_per_iteration : float, optional
        The run's estimate, used until two iterations have been timed (None: no ETA until then).
    clock : callable, optional
        Seconds now (default :func:`time.perf_counter`, read at each call; tests pass a fake one).

    :meth:`mark` after each iteration; :meth:`seconds` the ETA after iteration ``iteration``.
    """

    def __init__(self, total: int, *, window: int = _WINDOW, seconds_per_iteration: float | None = None,
                 clock=None):
        self.total = int(total)
        self.estimate = None if seconds_per_iteration is None else max(0.0, float(seconds_per_iteration))
        self._clock = clock
        self._seen = collections.deque(maxlen=int(window) + 1)  # (time, iteration) of the latest marks

    def now(self) -> float:
        return self._clock() if self._clock is not None else time.perf_counter()

    def mark(self, iteration: int) -> None:
        self._seen.append((self.now(), int(iteration)))

    @property
    def last(self) -> int | None:
        """The latest iteration marked (None before the first)."""
        return self._seen[-1][1] if self._seen else None

    def seconds(self, iteration: int) -> float | None:
        """The ETA after ``iteration``: the measured rate once two iterations are timed, the
        estimate before (None without one), None at the end."""
        left = self.total - int(iteration)
        if left <= 0:
            return None
        if len(self._seen) >= 2:
            (t0, i0), (t1, i1) = self._seen[0], self._seen[-1]
            if i1 > i0:
                return (t1 - t0) / (i1 - i0) * left
        return None if self.estimate is None else self.estimate * left


def check_verbose(verbose) -> int:
    """``verbose`` as an integer >= 0 (a bool counts as 0 or 1); anything else is a
    :class:`~ppdnmf_torch.errors.ConfigError` naming ``verbose``."""
    if isinstance(verbose, bool):
        return int(verbose)
    if not isinstance(verbose, numbers.Integral) or verbose < 0:
        raise ConfigError(f"verbose: must be an integer >= 0 (0: silent) or a bool, got {verbose!r}")
    return int(verbose)


def _seconds(s: float) -> str:
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m} min {sec} s" if m < 60 else f"{m // 60} h {m % 60} min"


class FitProgress:
    """One fit's progress: :meth:`update` after each iteration, :meth:`close` at the end.

    Parameters
    ----------
    verbose : int or bool
        0: silent; 1: a bar on a terminal, a line per :data:`INTERVAL` seconds elsewhere; 2 or
        more: a line per iteration.
    total : int
        The iteration cap (``max_iter``).
    label : str
        The estimator's name, first on every line.
    step : str
        What one iteration is called.
    file : file-like, optional
        Where the lines go (default ``sys.stderr``, read when the fit starts).
    bar : bool, optional
        Force the bar on or off (default: when ``verbose == 1`` and ``file`` is a terminal).
    """

    def __init__(self, verbose, total: int, label: str, *, step: str = "iteration", file=None, bar=None):
        self.level = check_verbose(verbose)
        self.total, self.label, self.step = int(total), label, step
        self.file = sys.stderr if file is None else file
        self._t0 = time.perf_counter()
        self._last = None
        self._eta = Eta(self.total)
        self.bar = None
        if self.level == 1 and (bar if bar is not None else _is_tty(self.file)):
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc=label, unit="it", file=self.file, leave=True, dynamic_ncols=True)
            self._shown_before = warnings.showwarning
            warnings.showwarning = self._above_the_bar  # a warning during the fit goes above the bar, not onto it

    @property
    def enabled(self) -> bool:
        return self.level > 0

    def eta(self, iteration: int) -> float | None:
        """Seconds to the cap at the rate of the latest iterations (None before the second)."""
        return self._eta.seconds(iteration)

    def line(self, iteration: int, metrics: dict) -> str:
        """``"<label>: <step> k/total, name value, ..., elapsed ..., ETA ..."``."""
        parts = [f"{self.label}: {self.step} {iteration}/{self.total}"]
        parts += [f"{k} {float(v):.6g}" for k, v in metrics.items() if v is not None]
        parts.append(f"elapsed {_seconds(time.perf_counter() - self._t0)}")
        eta = self.eta(iteration)
        if eta is not None:
            parts.append(f"ETA {_seconds(eta)} at most")  # the cap's: a run that converges ends sooner
        return ", ".join(parts)

    def update(self, iteration: int, metrics: dict) -> None:
        """After iteration ``iteration`` (1-based), with its ``metrics`` (name -> float)."""
        if not self.level:
            return
        now = time.perf_counter()
        self._eta.mark(iteration)
        if self.bar is not None:
            self.bar.update(int(iteration) - self.bar.n)
            self.bar.set_postfix({k: f"{float(v):.4g}" for k, v in metrics.items() if v is not None}, refresh=False)
            return
        due = (self.level >= 2 or self._last is None or now - self._last >= INTERVAL or iteration >= self.total)
        if due:
            self._last = now
            print(self.line(iteration, metrics), file=self.file, flush=True)

    def done(self, n_iter: int, metrics: dict | None = None) -> None:
        """The last line (the iterations run, when the fit stopped before its cap), then :meth:`close`."""
        last = self._eta.last
        if self.level and self.bar is None and last is not None and last < self.total:
            extra = ", ".join(f"{k} {float(v):.6g}" for k, v in (metrics or {}).items() if v is not None)
            print(f"{self.label}: stopped after {n_iter} {self.step}s" + (f", {extra}" if extra else "")
                  + f", elapsed {_seconds(time.perf_counter() - self._t0)}", file=self.file, flush=True)
        self.close()

    def _above_the_bar(self, message, category, filename, lineno, file=None, line=None):
        text = warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n")
        if self.bar is not None:
            self.bar.write(text, file=self.file)
        else:  # pragma: no cover - restored at close
            self._shown_before(message, category, filename, lineno, file, line)

    def close(self) -> None:
        if self.bar is not None:
            if warnings.showwarning == self._above_the_bar:
                warnings.showwarning = self._shown_before
            self.bar.close()
            self.bar = None

    def wrap(self, callback, metrics_of):
        """A fit's callback that reports ``metrics_of(info) -> (iteration, metrics)`` and then
        calls ``callback`` (its answer, True to stop, is the fit's); ``callback`` itself when silent."""
        if not self.level:
            return callback

        def reporting(info):
            iteration, metrics = metrics_of(info)
            self.update(iteration, metrics)
            return bool(callback(info)) if callback is not None else False

        return reporting

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
