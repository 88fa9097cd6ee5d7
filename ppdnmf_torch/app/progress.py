"""Progress of a CLI run: a tqdm bar on a terminal, log lines everywhere else.

On a terminal (stderr is a tty) each phase shows a tqdm bar, as before. Off a terminal
(nohup, a scheduler, joblib workers, a pipe) there is no bar: every ``interval`` seconds,
and at the first and the last BCD iteration, one line goes to the ``ppdnmf_torch.app.progress``
logger (iteration, NMSE, consensus error, elapsed time, ETA), so Hydra's ``ppdnmf.log`` and
the console get it. On a terminal those lines still go to the log files, never to a
terminal the bar is drawn on; and while a bar is drawn, every other line for the terminal
(a log record, a warning: :func:`write_line`) is written above it (``tqdm.write``), never onto
the bar's line.

The ETA (:class:`~ppdnmf_torch.driver.progress.Eta`) is the time per iteration over the last
few iterations (:data:`ETA_WINDOW`) times the iterations left, from the second iteration on,
so that the first iteration's setup (a similarity, a compilation, key generation) does not
make it wild; before that it is the run's own estimate per iteration when the phase has one
(``seconds_per_iteration``: a Paillier run's cost estimate), and none otherwise.
"""
from __future__ import annotations

import logging
import sys
import time

__all__ = ["Progress", "format_seconds", "log", "write_line", "ETA_WINDOW"]

#: the ETA's rate is measured over at most this many of the latest iterations
ETA_WINDOW = 20
#: the bars drawn now (a line for the terminal goes above them)
_ACTIVE: list = []


def write_line(text: str, file=None) -> None:
    """``text`` on its own line of ``file`` (default stderr): above a progress bar being drawn
    (``tqdm.write``), or printed as usual."""
    file = sys.stderr if file is None else file
    if _ACTIVE:
        from tqdm.auto import tqdm

        tqdm.write(text, file=file)
        return
    print(text, file=file, flush=True)


class _AboveTheBar(logging.Handler):
    """A terminal handler's records written above the bar (``tqdm.write``), formatted and
    filtered as the handler it stands in for."""

    def __init__(self, inner: logging.StreamHandler):
        super().__init__(inner.level)
        self.inner = inner
        self.setFormatter(inner.formatter)
        for f in inner.filters:
            self.addFilter(f)

    def emit(self, record):
        try:
            write_line(self.format(record), file=self.inner.stream)
        except Exception:  # noqa: BLE001 - logging's rule: a failed record never stops the run
            self.handleError(record)

log = logging.getLogger("ppdnmf_torch.progress")


def format_seconds(s: float) -> str:
    """``"4.2 s"``, ``"3 min 12 s"``, ``"2 h 19 min"``."""
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    if m < 60:
        return f"{m} min {sec} s"
    h, m = divmod(m, 60)
    return f"{h} h {m} min"


class _OffTerminal(logging.Filter):
    """Drops progress records on handlers that write to a terminal (where the bar is)."""

    def filter(self, record):
        return record.name != log.name


def _stream_is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


#: the metrics the progress shows under their own names (PPDNMF's)
_NAMED = ("nmse", "consensus", "central")


class Progress:
    """One phase of a run (the centralized baseline, the distributed fit), ``total`` BCD iterations.

    Parameters
    ----------
    enabled : bool
        Report at all (a bar on a terminal, log lines elsewhere).
    total : int
        BCD iterations of the phase.
    label : str
    interval : float
        Seconds between two log lines (off a terminal).
    start : int
        Iterations already done (a resumed run).
    bar : bool, optional
        Force the bar on (True) or off (False); default: when stderr is a terminal.
    step : str
        What one iteration is called in the log lines (another model's outer iteration).
    seconds_per_iteration : float, optional
        The phase's own estimate of one iteration, its ETA until two iterations are timed.
    clock : callable, optional
        Seconds now for the ETA (default :func:`time.perf_counter`; tests pass a fake one).

    :meth:`update` after every BCD iteration with the iteration and its metrics; :meth:`close`
    at the end.
    """

    def __init__(self, enabled: bool, total: int, label: str, *, interval: float = 5.0, start: int = 0,
                 bar: bool | None = None, step: str = "BCD iteration", seconds_per_iteration: float | None = None,
                 clock=None):
        self.enabled, self.total, self.label, self.step = bool(enabled), int(total), label, step
        self.interval, self.start = float(interval), int(start)
        self.bar = None
        self._t0 = time.perf_counter()
        self._last_line = None
        self._filtered = []
        self._swapped = []
        from ..driver.progress import Eta  # here: the driver package imports torch, the help does not

        self._eta = Eta(self.total, window=ETA_WINDOW, seconds_per_iteration=seconds_per_iteration, clock=clock)
        if not self.enabled:
            return
        if bar if bar is not None else _stream_is_tty(sys.stderr):
            from tqdm.auto import tqdm

            # tqdm's own rate would count the setup before the first iteration: the ETA is ours
            self.bar = tqdm(total=self.total, initial=self.start, desc=label, unit="it", leave=True,
                            dynamic_ncols=True, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")
            _ACTIVE.append(self.bar)
            self._keep_lines_off_terminal()

    def _keep_lines_off_terminal(self) -> None:
        for lg in (logging.getLogger(), log):
            for h in list(lg.handlers):
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) \
                        and _stream_is_tty(getattr(h, "stream", None)):
                    f = _OffTerminal()
                    h.addFilter(f)
                    self._filtered.append((h, f))
                    above = _AboveTheBar(h)
                    lg.removeHandler(h)
                    lg.addHandler(above)
                    self._swapped.append((lg, h, above))

    def eta(self, iteration: int) -> float | None:
        """Seconds to the last iteration at the rate of the latest ones from the second on; the
        estimate per iteration before (None without one)."""
        return self._eta.seconds(iteration)

    def line(self, iteration: int, metrics: dict) -> str:
        """The log line of ``iteration`` (``metrics``: floats; ``nmse``, ``consensus``, ``central``,
        then any other, as ``name value``)."""
        elapsed = time.perf_counter() - self._t0
        done = iteration - self.start
        parts = [f"{self.label}: {self.step} {iteration}/{self.total}"]
        if "nmse" in metrics:
            parts.append(f"NMSE {metrics['nmse']:.6g}")
        if "consensus" in metrics:
            parts.append(f"consensus {metrics['consensus']:.3g}")
        if "central" in metrics:
            parts.append(f"centralized {metrics['central']:.6g}")
        parts += [f"{k} {v:.4g}" for k, v in metrics.items() if k not in _NAMED and v is not None]
        parts.append(f"elapsed {format_seconds(elapsed)}")
        eta = self.eta(iteration) if 0 < done else None
        if eta is not None:
            parts.append(f"ETA {format_seconds(eta)}")
        return ", ".join(parts)

    def update(self, iteration: int, metrics: dict) -> None:
        if not self.enabled:
            return
        self._eta.mark(iteration)
        if self.bar is not None:
            shown = {"nmse": f"{metrics['nmse']:.4g}"} if "nmse" in metrics else {}
            if "consensus" in metrics:
                shown["cons"] = f"{metrics['consensus']:.2g}"
            if "central" in metrics:
                shown["central"] = f"{metrics['central']:.4g}"
            shown.update({k: f"{v:.4g}" for k, v in metrics.items() if k not in _NAMED and v is not None})
            eta = self.eta(iteration)
            if eta is not None:
                shown["ETA"] = format_seconds(eta)
            self.bar.update(1)
            self.bar.set_postfix(shown, refresh=False)
        now = time.perf_counter()
        due = self._last_line is None or now - self._last_line >= self.interval or iteration >= self.total
        if due:
            self._last_line = now
            log.info(self.line(iteration, metrics))

    def close(self) -> None:
        for lg, h, above in self._swapped:
            lg.removeHandler(above)
            lg.addHandler(h)
        self._swapped = []
        if self.bar is not None:
            self.bar.close()
            if self.bar in _ACTIVE:
                _ACTIVE.remove(self.bar)
            self.bar = None
        for h, f in self._filtered:
            h.removeFilter(f)
        self._filtered = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
