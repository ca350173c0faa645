"""The epoch-boundary recorder: a thin object over the functional instruments.

``Recorder.observe(ctx)`` returns flat history fields (names declared in
:mod:`fathom.telemetry.registry`). It is read-only by construction:

* the probe runs in dense evaluation mode (:func:`fathom.depth.dense_eval`) and every
  module's train/eval flag is restored afterwards;
* gradients come from ``torch.autograd.grad`` on the affine outputs, never ``.backward()``,
  so no ``.grad`` tensor is created, changed or freed;
* parameters and optimizer state are only read;
* telemetry draws no random numbers; the global CPU (and, if initialised, CUDA) RNG states
  are nevertheless saved and restored around every observation.

The caller times ``observe`` with the telemetry clock (the trainer records
``clock/telemetry_s`` and the cold first call).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from fathom.config import TelemetryConfig
from fathom.depth import dense_eval
from fathom.errors import FathomError
from fathom.telemetry import params as P
from fathom.telemetry.distributions import entry_summary, zero_fractions
from fathom.telemetry.moments import gradient_gram, moments_from_grams
from fathom.telemetry.registry import expected_names, resolve_families
from fathom.telemetry.scores import class_scores, confusion_matrix

if TYPE_CHECKING:
    from fathom.data import DataSplits
    from fathom.train.context import EpochContext

Value = float | int | None | list
SPLITS: tuple[str, ...] = ("fit", "val", "test")
_MOMENT_KEYS = (
    "mean_sq_norm",
    "diversity",
    "max_share",
    "participation",
    "cos_cyclic_mean",
    "noise_scale",
    "cov_along_mean",
)


@contextmanager
def read_only(model: nn.Module) -> Iterator[None]:
    """Dense evaluation for the block; restores module flags, gate gains and RNG states."""
    flags = [(m, m.training) for m in model.modules()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = (
        torch.cuda.get_rng_state_all()
        if torch.cuda.is_available() and torch.cuda.is_initialized()
        else None
    )
    try:
        with dense_eval(model):
            yield
    finally:
        for m, flag in flags:
            m.training = flag
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def schedule_due(epoch: int, first: tuple[int, ...], every: int, last: int) -> bool:
    """Due at the epochs in ``first``, at positive multiples of ``every``, and at ``last`` (never beyond)."""
    if epoch < 0 or epoch > last:
        return False
    return epoch in first or (epoch > 0 and epoch % every == 0) or epoch == last


def _split_xy(splits: DataSplits, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    return getattr(splits, f"{name}_x"), getattr(splits, f"{name}_y")


class Recorder:
    """Epoch-boundary telemetry for a model with ``forward_taps`` and ``affine_layers``."""

    def __init__(
        self,
        config: TelemetryConfig,
        *,
        epochs: int,
        splits: DataSplits,
        model: nn.Module,
        seed: int,
    ) -> None:
        self.config = config
        self.epochs = int(epochs)
        self.seed = int(seed)
        self.families = resolve_families(config.families)
        if not hasattr(model, "forward_taps") or not hasattr(model, "affine_layers"):
            raise FathomError(
                f"telemetry needs a model with forward_taps() and affine_layers() (e.g. CiresanMLP), "
                f"got {type(model).__name__}; disable telemetry (telemetry.enabled = false) for this model"
            )
        bad = [e for e in config.first if e < 0 or e > self.epochs]
        if bad:
            raise FathomError(
                f"telemetry.first names epochs {bad} outside training (0 .. {self.epochs}); "
                f"remove them or raise optim.epochs"
            )
        fit_x, fit_y = _split_xy(splits, "fit")
        n_fit = int(fit_y.shape[0])
        if config.probe_size > n_fit:
            raise FathomError(
                f"telemetry.probe_size = {config.probe_size} is larger than the fitting split "
                f"({n_fit} examples); lower telemetry.probe_size to at most {n_fit}"
            )
        self.probe_x = fit_x[: config.probe_size]
        self.probe_y = fit_y[: config.probe_size]
        self.splits = splits
        self.layers: list[nn.Linear] = list(model.affine_layers())
        self.classes = int(self.layers[-1].out_features)
        self.split_names = tuple(s for s in SPLITS if int(_split_xy(splits, s)[1].shape[0]) > 0)
        names = {id(p): n for n, p in model.named_parameters()}
        self._names = tuple(
            expected_names(self.families, len(self.layers), self.split_names, self.classes)
        )
        self.param_names = [
            (names[id(lin.weight)], names[id(lin.bias)] if lin.bias is not None else None)
            for lin in self.layers
        ]

    # -- schedule -------------------------------------------------------------------------
    def due(self, epoch: int) -> bool:
        return schedule_due(epoch, self.config.first, self.config.every, self.epochs)

    def field_names(self) -> list[str]:
        """The names ``observe`` returns, in registry order."""
        return list(self._names)

    # -- measurement ----------------------------------------------------------------------
    def observe(
        self, ctx: EpochContext, predictions: Mapping[str, torch.Tensor] | None = None
    ) -> dict[str, Value]:
        """All selected families at this epoch boundary; leaves every piece of state as found.

        ``predictions`` (optional): per split, the predicted class of every example (argmax
        of dense-evaluation logits) from the caller's own evaluation at this same boundary.
        Splits given there are scored from them instead of a second full-split forward pass.
        """
        fams = set(self.families)
        row: dict[str, Value] = {}
        with read_only(ctx.model), torch.enable_grad():
            if fams & {"probe", "activations", "backprop", "gradients", "moments"}:
                row.update(self._probe(ctx.model, fams))
            if "params" in fams:
                row.update(self._params(ctx))
        if "scores" in fams:
            with read_only(ctx.model), torch.no_grad():
                row.update(self._scores(ctx.model, ctx.config.eval.batch_size, predictions or {}))
        return {name: row[name] for name in self._names}

    def _probe(self, model: nn.Module, fams: set[str]) -> dict[str, Value]:
        row: dict[str, Value] = {}
        needs_delta = bool(fams & {"backprop", "gradients", "moments"})
        with torch.set_grad_enabled(needs_delta):
            logits, taps = model.forward_taps(self.probe_x)
        y = self.probe_y.long()
        losses = F.cross_entropy(logits.detach(), y, reduction="none").to(torch.float64)
        if "probe" in fams:
            row["probe/ce"] = float(losses.mean())
            row["probe/acc"] = float((logits.detach().argmax(dim=1) == y).double().mean())
        if "activations" in fams:
            for i, (a, _) in enumerate(taps[1:]):
                for key, v in {**entry_summary(a), **zero_fractions(a)}.items():
                    row[f"probe/act/{key}/L{i}"] = v
        if not needs_delta:
            return row
        # delta_i = dL_i/dz_i: the gradient of the *summed* per-example CE w.r.t. each affine
        # output z; example i only reaches row i of z, so row i is dL_i/dz_i exactly.
        total = F.cross_entropy(logits, y, reduction="sum")
        deltas = torch.autograd.grad(total, [z for _, z in taps])
        if "backprop" in fams:
            for i, d in enumerate(deltas):
                for key, v in entry_summary(d).items():
                    row[f"probe/delta/{key}/L{i}"] = v
        if fams & {"gradients", "moments"}:
            grams = torch.stack(
                [gradient_gram(a, d) for (a, _), d in zip(taps, deltas, strict=True)]
            )
            moments = moments_from_grams(grams)
            bias_norms = torch.stack(
                [d.detach().to(torch.float64).mean(dim=0).norm() for d in deltas]
            )
            for i, (mom, bias_norm) in enumerate(zip(moments, bias_norms.tolist(), strict=True)):
                if "gradients" in fams:
                    row[f"grad/mean/weight_norm/L{i}"] = mom.mean_norm
                    row[f"grad/mean/bias_norm/L{i}"] = bias_norm
                if "moments" in fams:
                    for key in _MOMENT_KEYS:
                        row[f"grad/pex/{key}/L{i}"] = getattr(mom, key)
        return row

    def _params(self, ctx: EpochContext) -> dict[str, Value]:
        row: dict[str, Value] = {}
        opt = ctx.optimizer
        for i, (lin, (w_name, b_name)) in enumerate(
            zip(self.layers, self.param_names, strict=True)
        ):
            w = lin.weight
            w0 = ctx.initial_params[w_name]
            w_norm = P.frob(w)
            row[f"param/weight_norm/L{i}"] = w_norm
            row[f"param/bias_norm/L{i}"] = P.frob(lin.bias) if b_name is not None else None
            row[f"param/disp/L{i}"] = P.displacement(w, w0)
            row[f"param/disp_rel/L{i}"] = P.ratio(row[f"param/disp/L{i}"], P.frob(w0))
            row[f"param/momentum_norm/L{i}"] = P.momentum_norm(w, opt)
            row[f"param/update_ratio/L{i}"] = P.ratio(P.sgd_last_update_norm(w, opt), w_norm)
        sq = 0.0
        for name, p in ctx.model.named_parameters():
            sq += P.displacement(p, ctx.initial_params[name]) ** 2
        row["param/disp_total"] = sq**0.5
        return row

    def _scores(
        self, model: nn.Module, batch_size: int, predictions: Mapping[str, torch.Tensor]
    ) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for split in self.split_names:
            x, y = _split_xy(self.splits, split)
            given = predictions.get(split)
            if given is not None:
                if given.shape != y.shape:
                    raise FathomError(
                        f"predictions for split {split!r} have shape {tuple(given.shape)}, the split "
                        f"has {tuple(y.shape)} labels; pass one predicted class per example"
                    )
                conf = confusion_matrix(given.to(y.device), y, self.classes)
            else:
                conf = torch.zeros(self.classes, self.classes, dtype=torch.int64, device=y.device)
                for start in range(0, int(y.shape[0]), batch_size):
                    pred = model(x[start : start + batch_size]).argmax(dim=1)
                    conf += confusion_matrix(pred, y[start : start + batch_size], self.classes)
            counts, acc = class_scores(conf)
            for c in range(self.classes):
                row[f"split/{split}/class_count/{c}"] = counts[c]
                row[f"split/{split}/class_acc/{c}"] = acc[c]
            row[f"split/{split}/confusion"] = conf.tolist()
        return row
