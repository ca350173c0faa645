"""Terminal tables that fit 80 columns without cutting identifiers, and live progress.

Rules every command follows: a table fits :data:`WIDTH` columns at the default width; run
ids, hashes, statuses and verdict words are *key* cells — never wrapped, never cut with an
ellipsis (they get their full width, other cells wrap onto more lines); hashes are shown
as their first :data:`HASH_CHARS` hex digits, in full with ``--wide`` (or ``--json``, which
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

WIDTH = 80
"""The terminal width every default table fits."""

WIDE_WIDTH = 250
"""The console width used with ``--wide`` (long rows are not wrapped)."""

HASH_CHARS = 12
"""Hex digits of a shortened hash (48 bits: a collision among a study's runs is negligible)."""

OnProgress = Callable[[str, dict[str, Any]], None]
"""A trainer's progress callback: ``(event, fields)``, e.g. ``("epoch", <history row>)`` at
every observed epoch boundary (``fathom.train.train(progress=...)``, a depth-scaling
benchmark, live tracking)."""

Say = Callable[[str], None]
"""A callback that shows the user one line of progress (a command's ``say``)."""


def short_hash(value: str | None, wide: bool = False) -> str:
    """``value[:12]`` (or all of it with ``wide``); ``"—"`` when there is none."""
    if not value:
        return "—"
    return value if wide else value[:HASH_CHARS]


def console(wide: bool = False, *, stderr: bool = False) -> Console:
    """A rich console: the terminal's width, or :data:`WIDE_WIDTH` with ``wide``."""
    from rich.console import Console

    return Console(width=WIDE_WIDTH if wide else None, stderr=stderr)


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
    done in this epoch / wall time since its first step) and two ETAs: the epoch's (steps
    left / rate) and the run's (the epoch's plus the epochs left times the mean wall time of
    the epochs completed in this invocation, evaluation included; before one completed, the
    epoch's steps / rate). It is redrawn at most :data:`REDRAWS_PER_S` times a second and
    only when its text changed. Off a terminal (CI logs, pipes) nothing but one line per
    epoch is written (:func:`epoch_line`), the line a terminal gets above the bar.

    ``step`` events carry Python ints the loop has anyway; nothing is read from the device.
    """

    def __init__(self, out: Console | None = None, clock: Any = None) -> None:
        import time

        self.console = out if out is not None else console(stderr=True)
        self.clock = clock or time.monotonic
        self.live_view = self.console.is_terminal
        self.redraws = 0
        self._live: Any = None
        self._text = ""
        self._last_draw = -math.inf
        self._epoch, self._t0, self._done, self._steps = 0, 0.0, 0, 0
        self._walls: list[float] = []
        self._last_end: float | None = None
        self._train_s = 0.0
        self._row: dict[str, Any] = {}

    def __call__(self, event: str, info: dict[str, Any]) -> None:
        if event == "step":
            self._step(info)
        elif event == "epoch":
            self._row = info
            if info["epoch"] == 0:
                self._print(epoch_line(info, None))
        elif event == "epoch_end":
            now = self.clock()
            if self._last_end is not None:
                self._walls.append(now - self._last_end)
            self._last_end = now
            train_s = info["clock/training_s"] - self._train_s
            self._train_s = info["clock/training_s"]
            rate = self._steps / train_s if self._steps and train_s > 0 else None
            row = self._row if self._row.get("epoch") == info["epoch"] else {}
            self._print(epoch_line({**info, **row}, rate))

    def _step(self, info: dict[str, Any]) -> None:
        now = self.clock()
        if info["epoch"] != self._epoch:
            self._epoch, self._t0, self._steps = info["epoch"], now, info["steps"]
            if self._last_end is None:
                self._last_end = now
        self._done = info["step"]
        if not self.live_view or now - self._last_draw < 1.0 / REDRAWS_PER_S:
            return
        text = self._status(info["epochs"], now)
        if text != self._text:
            self._draw(text, info)
            self._last_draw = now

    def _status(self, epochs: int, now: float) -> str:
        """``412/938  143.1 steps/s  ETA 0:04 epoch, 1:02 run``."""
        done, steps, elapsed = self._done, self._steps, now - self._t0
        rate = done / elapsed if done > 0 and elapsed > 0 else None
        left = eta_s(done, steps, elapsed)
        per_epoch = sum(self._walls) / len(self._walls) if self._walls else None
        if per_epoch is None and rate is not None:
            per_epoch = steps / rate
        run_left = (
            None if left is None or per_epoch is None else left + (epochs - self._epoch) * per_epoch
        )
        return (
            f"{done}/{steps}  {'—' if rate is None else f'{rate:.1f}'} steps/s  "
            f"ETA {fmt_duration(left)} epoch, {fmt_duration(run_left)} run"
        )

    def _draw(self, text: str, info: dict[str, Any]) -> None:
        from rich.live import Live
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        line = Table.grid(padding=(0, 1))
        line.add_row(
            f"epoch {info['epoch']}/{info['epochs']}",
            ProgressBar(total=info["steps"], completed=info["step"], width=20),
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


def epoch_line(row: dict[str, Any], rate: float | None) -> str:
    """``epoch 3/10 step 2814  loss 0.5647  val acc 97.12% ce 0.1032  test acc 96.98%  train
    clock 5.5s  143.2 steps/s``: the running loss, the evaluation when this epoch had one,
    the cumulative training clock and ``rate`` = the epoch's steps / its training clock."""
    from fathom.base.units import fmt_percent

    def f(key: str, spec: str) -> str:
        return "—" if row.get(key) is None else format(row[key], spec)

    total = f"/{row['epochs']}" if row.get("epochs") else ""
    line = f"epoch {row['epoch']}{total} step {row.get('step', 0)}"
    if row.get("train/loss_running") is not None:
        line += f"  loss {f('train/loss_running', '.4f')}"
    if "val/acc" in row or "test/acc" in row:
        line += f"  val acc {fmt_percent(row.get('val/acc'))} ce {f('val/ce', '.4f')}"
        line += f"  test acc {fmt_percent(row.get('test/acc'))}"
    if row.get("val/ppl") is not None:  # a language model: perplexity per token
        line += f"  val ppl {f('val/ppl', '.2f')}"
    if row.get("clock/training_s") is not None and row["epoch"] > 0:
        line += f"  train clock {row['clock/training_s']:.1f}s"
    return line + (f"  {rate:.1f} steps/s" if rate else "")


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
