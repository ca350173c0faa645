"""What the trainer keeps fixed across invocations, and advice that works when the disk fills.

* :func:`recorded_threads`: a resumed run computes with the thread count it was started
  with (CPU reductions, hence the parameters, depend on it); the count found is restored
  afterwards and the switch recorded (``threads_set_to_recorded``).
* :func:`matmul_precision`: TF32 or strict FP32 matmuls for the run's precision, flags restored.
* :func:`disk_full_advice`: an ``ENOSPC`` failure says how much space the rest of the run
  needs and how much is free, so that "free space, then ``--resume``" is advice that works.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fathom.errors import FathomError
from fathom.rundir import RunWriter, resume_file

if TYPE_CHECKING:
    from fathom.train.session import Session

_HEADROOM = 1 << 20
"""Bytes added to every space estimate: manifest rewrites, history rows, temp-file slack."""


@contextmanager
def recorded_threads(writer: RunWriter) -> Iterator[None]:
    """Run the block with ``environment.threads`` of the manifest a resume found (if any)."""
    recorded = None if writer.recorded is None else writer.recorded.environment.threads
    found = torch.get_num_threads()
    if not isinstance(recorded, int) or recorded < 1 or recorded == found:
        yield
        return
    writer.note("threads_set_to_recorded", recorded=recorded, found=found)
    torch.set_num_threads(recorded)
    try:
        yield
    finally:
        torch.set_num_threads(found)


def _bytes_to_finish(s: Session) -> int:
    """Estimated bytes the rest of ``s`` writes, each atomic write needing its new file
    beside the old one: ``2 * resume + weights * (epoch checkpoints left + 1 selected)``
    plus :data:`_HEADROOM`. ``weights`` is the tensor bytes of the model; ``resume`` the
    size of the current resume state, or ``4 * weights`` (model, optimizer, initial
    parameters) before the first one exists."""
    weights = sum(t.numel() * t.element_size() for t in s.model.state_dict().values())
    found = resume_file(s.run_dir)
    resume = found.stat().st_size if found is not None else 4 * weights
    done, last = s.progress.epoch, s.cfg.optim.epochs
    left = len({e for e in s.cfg.checkpoints.save_epochs if done <= e <= last} | {last})
    return 2 * resume + weights * (left + 1) + _HEADROOM


def disk_full_advice(e: BaseException, s: Session | None, run_dir: Path) -> BaseException:
    """``e`` itself, or for a full disk (``ENOSPC``/``EDQUOT``) a ``FathomError`` that adds
    how much space finishing needs, how much is free, and the command to continue with."""
    full = getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
    if not full or s is None or getattr(e, "space_advised", False):
        return e
    need = _bytes_to_finish(s)
    try:
        free = shutil.disk_usage(run_dir).free
    except OSError:
        free = None
    if free is None:
        step = "free space, then"
    elif free < need:
        step = f"{_size(free)} free now: free at least {_size(need - free)} more, then"
    else:
        step = f"{_size(free)} free now (enough, unless something else fills it):"
    advice = FathomError(
        f"{e}. Finishing {str(run_dir)!r} needs about {_size(need)} on its file system; "
        f"{step} continue with `fathom train --resume {run_dir}`"
    )
    advice.errno = getattr(e, "errno", None)  # ENOSPC or EDQUOT (``full``)
    advice.space_advised = True
    return advice


def _size(n: Any) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


@contextmanager
def matmul_precision(precision: str, device: torch.device):
    """TF32 matmuls on CUDA for ``tf32``/``bf16``; strict FP32 for ``fp32``. Restores flags."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    allow = precision in ("tf32", "bf16") and device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
