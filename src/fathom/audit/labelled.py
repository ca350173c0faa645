"""Per-mask numbers that say which mask each is: :class:`PerMask`.

``evaluate_masks(...).accuracy()`` (and ``.mean_ce()``, ``.damage()``) return one number per
mask. They stay numpy arrays (``[M]``, indexed, sliced and computed with as before), and
carry what a reader needs beside them: each row's mask label (:func:`fathom.audit.masks.
mask_label`, ``"1011"``: branch 0 first, ``1`` kept, ``0`` removed), which row is the full
network, the quantity and its stored unit. Printed, they are a table of labels and numbers in
the display unit (accuracy in percent, :func:`fathom.base.units.fmt_value`)::

    accuracy per mask (mask: branch 0 first, 1 kept, 0 removed)
      00    12.50%
      10    48.44%
      01    31.25%
      11    96.88%   full network

``scores.accuracy()["11"]`` reads one value by its label, ``.by_mask()`` gives ``{label:
value}`` in the stored unit (a fraction for accuracy). What is computed from it (``acc *
100``, ``ce - ce[3]``, a slice, a reduction) is a plain array or number: the labels and the
unit no longer hold for it.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from fathom.audit.masks import mask_label
from fathom.base.units import fmt_value, percent

Quantity = Literal["accuracy", "mean CE", "CE damage", "loss", "loss damage"]
_UNITS: dict[str, tuple[str, str]] = {
    "accuracy": ("fraction", "%"),
    "mean CE": ("nats", "nats"),
    "CE damage": ("nats", "nats"),
    "loss": ("the loss's units", ""),  # a [loss] other than cross-entropy (mse: logit²)
    "loss damage": ("the loss's units", ""),
}
"""quantity -> (stored unit, display unit of :func:`fathom.base.units.fmt_value`)."""


class PerMask(np.ndarray):
    """One number per mask, labelled (module docstring); a plain ``ndarray`` otherwise."""

    labels: tuple[str, ...] | None
    full: int | None
    quantity: str | None

    @classmethod
    def of(cls, values: np.ndarray, masks: np.ndarray, full: int, quantity: Quantity) -> PerMask:
        out = np.asarray(values).view(cls)
        out.labels = tuple(mask_label(m) for m in masks)
        out.full, out.quantity = full, quantity
        return out

    def __array_finalize__(self, obj: Any) -> None:
        same = obj is not None and getattr(obj, "shape", None) == self.shape
        self.labels = getattr(obj, "labels", None) if same else None
        self.full = getattr(obj, "full", None) if same else None
        self.quantity = getattr(obj, "quantity", None) if same else None

    def __array_wrap__(self, arr: Any, context: Any = None, return_scalar: bool = False) -> Any:
        """A computed result (``acc * 100``, ``ce - ce[3]``) is a plain array or number: the
        quantity and unit it was labelled with no longer hold."""
        plain = np.asarray(arr).view(np.ndarray)
        return plain[()] if return_scalar else plain

    @property
    def labelled(self) -> bool:
        return self.labels is not None and self.ndim == 1 and len(self.labels) == len(self)

    @property
    def unit(self) -> str | None:
        """The stored unit (``fraction`` for accuracy, ``nats`` for CE)."""
        return _UNITS[self.quantity][0] if self.quantity in _UNITS else None

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str) and self.labelled:
            assert self.labels is not None
            if key not in self.labels:
                from fathom.errors import FathomError

                raise FathomError(
                    f"no mask {key!r} among {', '.join(self.labels[:8])}"
                    f"{' ...' if len(self.labels) > 8 else ''} (a mask is one bit per branch, "
                    "branch 0 first: 1 kept, 0 removed)"
                )
            return float(np.asarray(self)[self.labels.index(key)])
        return np.asarray(self)[key]  # a slice no longer has one row per mask label

    def by_mask(self) -> dict[str, float]:
        """``{mask label: value}`` in the stored unit; a plain dict (JSON, a DataFrame)."""
        if not self.labelled:
            return {}
        assert self.labels is not None
        return {label: float(v) for label, v in zip(self.labels, np.asarray(self), strict=True)}

    def _shown(self, v: float) -> str:
        display = _UNITS[self.quantity][1] if self.quantity in _UNITS else ""
        value = percent(v) if self.quantity == "accuracy" else v
        return fmt_value(value, display, signed=self.quantity in ("CE damage", "loss damage"))

    def __str__(self) -> str:
        if not self.labelled:
            return str(np.asarray(self))
        assert self.labels is not None
        width = max(len(label) for label in self.labels)
        rows = [f"{self.quantity} per mask (mask: branch 0 first, 1 kept, 0 removed)"]
        for i, (label, v) in enumerate(zip(self.labels, np.asarray(self), strict=True)):
            note = "   full network" if i == self.full else ""
            rows.append(f"  {label:<{width}}  {self._shown(float(v)):>12}{note}")
        return "\n".join(rows)

    def __repr__(self) -> str:
        return str(self) if self.labelled else repr(np.asarray(self))

    def __reduce__(self) -> Any:  # pickled (multiprocessing) as the plain array it holds
        return np.asarray(self).copy().__reduce__()
