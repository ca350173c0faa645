"""Terminal tables that fit 80 columns without cutting identifiers, and live progress.

Rules every command follows: a table fits :data:`_WIDTH` columns at the default width; run
ids, hashes, statuses and verdict words are *key* cells — never wrapped, never cut with an
ellipsis (they get their full width, other cells wrap onto more lines); hashes are shown
as their first :data:`_HASH_CHARS` hex digits, in full with ``--wide`` (or ``--json``, which
prints every value). Progress displays (:class:`TrainProgress`, :class:`Tally`) redraw at
most :data:`REDRAWS_PER_S` times a second, never without change, and write one line per
epoch or item where the output is not a terminal. Imports of ``rich`` happen inside the
functions, so importing this module costs nothing at start-up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

_WIDTH = 80
"""The terminal width every default table fits."""

_WIDE_WIDTH = 250
"""The console width used with ``--wide`` (long rows are not wrapped)."""

_HASH_CHARS = 12
"""Hex digits of a shortened hash (48 bits: a collision among a study's runs is negligible)."""

OnProgress = Callable[[str, dict[str, Any]], None]
"""A trainer's progress callback: ``(event, fields)``, e.g. ``("epoch", <history row>)`` at
every observed epoch boundary (``fathom.train.loop.train(progress=...)``, a depth-scaling
benchmark, live tracking)."""

Say = Callable[[str], None]
"""A callback that shows the user one line of progress (a command's ``say``)."""


def short_hash(value: str | None, wide: bool = False) -> str:
    """``value[:12]`` (or all of it with ``wide``); ``"—"`` when there is none."""
    if not value:
        return "—"
    return value if wide else value[:_HASH_CHARS]


def console(wide: bool = False, *, stderr: bool = False) -> Console:
    """A rich console: the terminal's width, or :data:`_WIDE_WIDTH` with ``wide``."""
    from rich.console import Console

    return Console(width=_WIDE_WIDTH if wide else None, stderr=stderr)


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    wrap: Sequence[str] = (),
    right: Sequence[str] = (),
    caption: str | None = None,
) -> RenderableType:
    """A compact table whose cells are never wrapped or cut, except the ``wrap`` columns.

    Identifiers, numbers, hashes and verdict words keep their full width (a number is never
    split across lines); ``wrap`` columns (free text) fold onto more lines instead of being
    cut. A header may hold ``\n`` to stack its words. Columns are separated by one space.
    The title is a line of its own above the table (wrapped at the terminal's width, not
    the table's).
    """
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    out = Table(
        caption=caption,
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        padding=(0, 0),
        title_justify="left",
        caption_justify="left",
    )
    cells = [[str(c) for c in r] for r in rows]
    for i, name in enumerate(columns):
        justify = "right" if name in right else "left"
        if name in wrap:
            out.add_column(name, overflow="fold", justify=justify)
            continue
        widest = max([len(r[i]) for r in cells] + [len(x) for x in name.split("\n")])
        out.add_column(name, no_wrap=True, min_width=widest, overflow="ignore", justify=justify)
    for r in cells:
        out.add_row(*r)
    return out if title is None else Group(Text(title, style="bold"), out)


REDRAWS_PER_S = 4.0
"""At most this many redraws of a live progress display per second (and none without change)."""


def fmt_duration(seconds: float | None) -> str:
    """``75.2 -> "1:15"``, ``3725 -> "1:02:05"``; ``"—"`` when unknown."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "—"
    s = round(seconds)
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def eta_s(done: float, total: float, elapsed_s: float) -> float | None:
    """Time left at the observed rate: ``(total - done) * elapsed / done`` (``None`` before any)."""
    return None if done <= 0 or elapsed_s <= 0 else (total - done) * elapsed_s / done


class TrainProgress:
    """``fathom train``'s display: the trainer's ``progress(event, info)`` callback.

    On a terminal a live line shows the epoch, a bar over its steps, the step rate (steps
    done in this epoch / wall time since its first step) and two ETAs, the epoch's and the
    run's, from the run's measured clocks (:class:`fathom.base.eta.RunEta`: training steps,
    evaluations, instruments and the rest of each epoch, each at its measured cost). When an
    epoch's steps are done and its evaluation or instruments run, the line says so
    (``evaluating val, test``) instead of a bar standing still. A time still unknown (a
    resume before its first evaluation) makes the ETA a lower bound, shown ``≥``. The line is
    redrawn at most :data:`REDRAWS_PER_S` times a second and only when its text changed.
    Off a terminal (CI logs, pipes) nothing but one line per epoch is written
    (:func:`_epoch_line`, with the run's ETA), the line a terminal gets above the bar.

    ``step`` events carry Python ints the loop has anyway; nothing is read from the device.
    """

    def __init__(self, out: Console | None = None, clock: Any = None) -> None:
        import time

        from fathom.base.eta import RunEta

        self.console = out if out is not None else console(stderr=True)
        self.clock = clock or time.monotonic
        self.live_view = self.console.is_terminal
        self.redraws = 0
        self.eta = RunEta()
        self._live: Any = None
        self._text = ""
        self._last_draw = -math.inf
        self._epoch, self._epochs, self._t0, self._done, self._steps = 0, 0, 0.0, 0, 0
        self._boundary: tuple[float, dict[str, Any]] | None = None
        self._train_s = 0.0
        self._row: dict[str, Any] = {}

    def __call__(self, event: str, info: dict[str, Any]) -> None:
        now = self.clock()
        if event == "step":
            self._step(info, now)
            return
        if event == "epoch_end":
            info = {**info, "steps_in_epoch": self._steps if self._epoch == info["epoch"] else 0}
        self.eta.event(event, info, now)
        if event == "epoch":
            self._row = info
            if info["epoch"] == 0:
                self._print(_epoch_line(info, None))
        elif event == "boundary":
            self._boundary = (now, info)
            if self.live_view:
                self._redraw(now, force=True)
        elif event == "epoch_end":
            self._boundary = None
            train_s = info["clock/training_s"] - self._train_s
            self._train_s = info["clock/training_s"]
            rate = self._steps / train_s if self._steps and train_s > 0 else None
            row = self._row if self._row.get("epoch") == info["epoch"] else {}
            _, run = self._left(now, ended=info["epoch"])
            self._print(_epoch_line({**info, **row}, rate, run))

    def _step(self, info: dict[str, Any], now: float) -> None:
        if info["epoch"] != self._epoch:
            self._epoch, self._t0, self._steps = info["epoch"], now, info["steps"]
        self._epochs, self._done = info["epochs"], info["step"]
        if self.live_view:
            self._redraw(now)

    def _redraw(self, now: float, force: bool = False) -> None:
        if not force and now - self._last_draw < 1.0 / REDRAWS_PER_S:
            return
        text = self._status(now)
        if text != self._text:
            self._draw(text)
            self._last_draw = now

    def _left(self, now: float, ended: int | None = None) -> tuple[Any, Any]:
        """``(epoch, run)`` estimates now (after epoch ``ended``: from the next one on)."""
        if ended is not None:  # between epochs: the next epoch, none of its steps done
            return self.eta.left(ended + 1, self._epochs, 0, self._steps)
        elapsed = now - self._t0
        wall_step = elapsed / self._done if self._done > 0 and elapsed > 0 else None
        since = now - self._boundary[0] if self._boundary is not None else None
        done = self._steps if self._boundary is not None else self._done
        return self.eta.left(self._epoch, self._epochs, done, self._steps, wall_step, since)

    def _status(self, now: float) -> str:
        """``412/938  143.1 steps/s  ETA 0:04 epoch, 1:02 run`` while training, and
        ``evaluating val, test + instruments  ETA 0:03 epoch, 0:58 run`` after its steps."""
        epoch, run = self._left(now)
        etas = f"ETA {fmt_eta(epoch)} epoch, {fmt_eta(run)} run"
        if self._boundary is not None:
            info = self._boundary[1]
            what = [f"evaluating {', '.join(info['evaluate'])}"] if info["evaluate"] else []
            what += ["instruments"] if info["instruments"] else []
            return f"{' + '.join(what) or 'observing'}  {etas}"
        elapsed = now - self._t0
        rate = self._done / elapsed if self._done > 0 and elapsed > 0 else None
        return (
            f"{self._done}/{self._steps}  {'—' if rate is None else f'{rate:.1f}'} steps/s  {etas}"
        )

    def _draw(self, text: str) -> None:
        from rich.live import Live
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        done = self._steps if self._boundary is not None else self._done
        line = Table.grid(padding=(0, 1))
        line.add_row(
            f"epoch {self._epoch}/{self._epochs}",
            ProgressBar(total=self._steps or 1, completed=done, width=20),
            text,
        )
        if self._live is None:
            self._live = Live(console=self.console, auto_refresh=False, transient=True)
            self._live.start()
        self._live.update(line, refresh=True)
        self._text = text
        self.redraws += 1

    def _print(self, line: str) -> None:
        self.console.print(line, soft_wrap=True, highlight=False)

    def close(self) -> None:
        """Stop the live line (the per-epoch lines stay)."""
        if self._live is not None:
            self._live.stop()
            self._live = None


def fmt_eta(estimate: Any) -> str:
    """An :class:`fathom.base.eta.Estimate` as ``1:02``, ``≥1:02`` (a lower bound) or ``—``."""
    text = fmt_duration(estimate.seconds)
    return f"≥{text}" if estimate.lower_bound and estimate.seconds is not None else text


def _epoch_line(row: dict[str, Any], rate: float | None, run_left: Any = None) -> str:
    """``epoch 3/10 step 2814  loss 0.5647  val acc 97.12% ce 0.1032  test acc 96.98%  train
    clock 5.5s  143.2 steps/s  ETA 0:41``: the running loss, the evaluation when this epoch
    had one, the cumulative training clock, ``rate`` = the epoch's steps / its training
    clock, and the run's time left (``run_left``, an :class:`fathom.base.eta.Estimate`)
    before its last epoch."""
    from fathom.base.units import fmt_percent

    def f(key: str, spec: str) -> str:
        return "—" if row.get(key) is None else format(row[key], spec)

    total = f"/{row['epochs']}" if row.get("epochs") else ""
    line = f"epoch {row['epoch']}{total} step {row.get('step', 0)}"
    if row.get("train/loss_running") is not None:
        line += f"  loss {f('train/loss_running', '.4f')}"
    if "val/acc" in row or "test/acc" in row:
        line += f"  val acc {fmt_percent(row.get('val/acc'))} ce {f('val/ce', '.4f')}"
        if "val/loss" in row:  # a [loss] table: the loss that selects the checkpoint
            line += f" loss {f('val/loss', '.4g')}"
        line += f"  test acc {fmt_percent(row.get('test/acc'))}"
    if row.get("val/ppl") is not None:  # a language model: perplexity per token
        line += f"  val ppl {f('val/ppl', '.2f')}"
    if row.get("clock/training_s") is not None and row["epoch"] > 0:
        line += f"  train clock {row['clock/training_s']:.1f}s"
    line += f"  {rate:.1f} steps/s" if rate else ""
    last = row.get("epochs") is not None and row["epoch"] >= row["epochs"]
    if run_left is not None and run_left.seconds is not None and not last:
        line += f"  ETA {fmt_eta(run_left)}"
    return line


class Tally:
    """``3/12 runs  elapsed 0:37  ETA 1:51``: items done of a known total, with an ETA.

    ETA = (total - done) x elapsed / worked, where ``worked`` counts the items that did work
    in this invocation (an item found already done counts in ``done``, not in the rate), and
    elapsed is wall time since the tally started (so parallel workers are accounted for).
    """

    def __init__(self, total: int, what: str = "runs", clock: Any = None) -> None:
        import time

        self.total, self.what = total, what
        self.clock = clock or time.monotonic
        self.t0 = self.clock()
        self.done = self.worked = 0

    def add(self, worked: bool = True) -> str:
        """Count one item (``worked``: it did work now); return the tally line."""
        self.done += 1
        self.worked += bool(worked)
        elapsed = self.clock() - self.t0
        left = eta_s(self.worked, self.worked + self.total - self.done, elapsed)
        return (
            f"{self.done}/{self.total} {self.what}  elapsed {fmt_duration(elapsed)}  "
            f"ETA {fmt_duration(left if self.done < self.total else 0.0)}"
        )


class Throttle:
    """Pass progress lines on to ``say`` at most once every ``every_s`` seconds (the first at
    once) and never the same line twice in a row: for a line that changes faster than anyone
    reads it (per mask of an audit). Callers give it only on a terminal; logs get nothing."""

    def __init__(self, say: Any, every_s: float = 2.0, clock: Any = None) -> None:
        import time

        self.say, self.every_s = say, every_s
        self.clock = clock or time.monotonic
        self.last_t: float | None = None
        self.last_line: str | None = None

    def __call__(self, line: str) -> bool:
        """Say ``line`` if its turn has come; True when it was said."""
        now = self.clock()
        if line == self.last_line or (self.last_t is not None and now - self.last_t < self.every_s):
            return False
        self.say(line)
        self.last_t, self.last_line = now, line
        return True
