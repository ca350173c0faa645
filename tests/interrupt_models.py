"""A user's ``python``-kind model that can send SIGINT to its own process at a chosen
moment, for the Ctrl-C tests of ``fathom train`` (``tests/test_train_interrupt.py``).

``FATHOM_TEST_SIGINT`` (read at each forward, unset in the reference and resumed runs):

* ``train:N``: during the N-th training-mode forward (one optimizer step each);
* ``eval:N``: during the first evaluation-mode forward after N training forwards, i.e. in
  the boundary of the epoch whose last step is the N-th.

The counters are plain attributes, outside ``state_dict()``: the weights, their hashes and
the trained bytes are those of the same model without the hook.
"""

from __future__ import annotations

import os
import signal

import numpy as np
from torch import nn

ENV = "FATHOM_TEST_SIGINT"


class InterruptibleMLP(nn.Module):
    """``Linear -> ReLU -> Linear``, with the SIGINT hook described in the module docstring."""

    def __init__(self, features: int = 16, hidden: int = 32, classes: int = 3) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))
        self.train_forwards = 0
        self.signalled = False

    def forward(self, x):
        if self.training:
            self.train_forwards += 1
        self._maybe_interrupt()
        return self.net(x.flatten(1))

    def _maybe_interrupt(self) -> None:
        plan = os.environ.get(ENV)
        if not plan or self.signalled:
            return
        mode, n = plan.split(":")
        due = (mode == "train" and self.training and self.train_forwards == int(n)) or (
            mode == "eval" and not self.training and self.train_forwards >= int(n)
        )
        if due:
            self.signalled = True
            os.kill(os.getpid(), signal.SIGINT)


def interruptible_mlp(features: int = 16, hidden: int = 32, classes: int = 3) -> nn.Module:
    return InterruptibleMLP(features, hidden, classes)


def write_features_npz(path, n: int = 400, features: int = 16, classes: int = 3):
    """``x`` float32 ``[n, features]`` (class c shifts feature c), ``y`` int64 labels."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, classes, n)
    x = rng.standard_normal((n, features)).astype(np.float32)
    x[np.arange(n), y] += 2.0
    np.savez(path, x=x, y=y)
    return path
