"""Curvature over a run directory's checkpoints: verify, convert to float64, compute, write.

Outputs, under ``<run>/curvature/`` (or ``out_dir``):

* ``epoch-NNNN.json``: one :func:`fathom.curvature.snapshot.curvature_snapshot` record with its
  provenance (the source hash of the code that computed it, the checkpoint file and hash it
  was computed from, and the agreement of the float64 probe model's predictions with the
  recorded float32 model's on the same probe), the probe scope and hash, and runtimes;
* ``summary.json`` and ``summary.md``: one row per snapshot.

A language model's run (its model kind's row says ``tokens``) is read with its own loss,
the token cross-entropy (:func:`fathom.models.gpt.token_loss`), and its GGN diagonal comes
from the estimator ``estimator`` names (default ``"auto"``: exact when it fits ``budget``,
else Monte-Carlo: :mod:`fathom.curvature.language`); its record and summary say the
estimator, samples and seed, the probe's token cross-entropy and perplexity, and the traces
per block. The probe is then the first ``N`` windows.

The probe is the first ``N`` examples of the run's fitting split, in stored order (the same
examples at every epoch). The hash of every requested checkpoint is verified before any
computation starts, so a bad file fails fast.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from fathom.base.io import tensor_digest
from fathom.base.provenance import source_hash
from fathom.base.terminal import Say
from fathom.base.units import fmt_value, percent
from fathom.curvature.definitions import NORMALIZATION
from fathom.curvature.exact import CURVATURE_FAMILIES, OLD_NAMES
from fathom.curvature.snapshot import curvature_snapshot, loss_snapshot
from fathom.depth import dense_eval
from fathom.errors import FathomError
from fathom.losses.kinds import NORMALIZATION as LOSS_NORMALIZATION
from fathom.losses.labels import LabelLoss
from fathom.rundir.output import AnalysisOutput, analysis_output

if TYPE_CHECKING:
    from fathom.rundir.reader import RunDir

_FORMAT = 1
SUMMARY_COLUMNS: tuple[tuple[str, str], ...] = (
    # (row key, label with its unit; a parameter unit is the unit of one weight entry)
    ("epoch", "epoch"),
    ("probe_ce_mean", "probe CE (nats)"),
    ("probe_accuracy", "probe acc (%)"),
    ("ggn_weight_trace", "GGN tr (nats / param. unit²)"),
    ("empirical_fisher_weight_trace", "EF tr (nats² / param. unit²)"),
    ("jacobian_gram_weight_trace", "Jac tr (logit² / param. unit²)"),
    ("kfac_diag_rel_l1_error_max", "KFAC diag err (max layer)"),
    ("rho", "rho"),
    ("cheap_rho", "cheap rho"),
    ("runtime_s", "runtime (s)"),
)
_LOSS_SUMMARY_COLUMNS: tuple[tuple[str, str], ...] = (
    # a classifier's snapshot under a loss other than plain cross-entropy (loss_snapshot)
    ("epoch", "epoch"),
    ("probe_loss", "probe loss"),
    ("probe_ce_mean", "probe CE (nats)"),
    ("probe_accuracy", "probe acc (%)"),
    ("ggn_weight_trace", "GGN tr"),
    ("empirical_fisher_weight_trace", "EF tr"),
    ("jacobian_gram_weight_trace", "Jac tr (logit² / param. unit²)"),
    ("kfac_diag_rel_l1_error_max", "KFAC diag err (max layer)"),
    ("runtime_s", "runtime (s)"),
)
# the columns printed in a unit of fathom.base.units (accuracy stored as a fraction)
_SUMMARY_UNITS = {"probe_ce_mean": "nats", "probe_accuracy": "%", "runtime_s": "s"}


def check_epochs(available: Sequence[int], requested: Sequence[int] | None) -> list[int]:
    """The requested epochs (all saved ones when ``None``); missing ones raise, listing what exists."""
    if requested is None:
        if not available:
            raise FathomError(
                "the run has no saved checkpoints; train it with checkpoints.save_epochs set"
            )
        return list(available)
    missing = [e for e in requested if e not in set(available)]
    if missing:
        raise FathomError(
            f"no checkpoint for epoch(s) {missing}; this run saved epochs {list(available)}. "
            "Choose among those with --epochs (or retrain with checkpoints.save_epochs)"
        )
    return list(dict.fromkeys(requested))


def probe_from_split(
    x: torch.Tensor, y: torch.Tensor, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``size`` examples of a split; a probe larger than the split raises."""
    if size <= 0:
        raise FathomError(f"--probe must be positive, got {size}")
    if size > x.shape[0]:
        raise FathomError(
            f"probe of {size} examples is larger than the fitting split ({x.shape[0]} examples); "
            f"use --probe {x.shape[0]} or fewer"
        )
    return x[:size], y[:size]


def _summary_row(epoch: int, record: dict) -> dict[str, Any]:
    errors = [layer["kfac"].get("kfac_diag_rel_l1_error") for layer in record["layers"]]
    errors = [e for e in errors if e is not None]
    mism = record["output_mismatch"]
    return {
        "epoch": epoch,
        "probe_ce_mean": record["probe_ce_mean"],
        "probe_accuracy": record["probe_accuracy"],
        **({"probe_loss": record["probe_loss"]} if "probe_loss" in record else {}),
        **{k: v for k, v in record["totals"].items() if k != "scope"},
        "kfac_diag_rel_l1_error_max": max(errors) if errors else None,
        "rho": mism["rho"],
        "cheap_rho": mism["cheap_rho"],
        "runtime_s": record["runtime_s"]["total_s"],
        "params_sha256": record["checkpoint"]["params_sha256"],
    }


def _fmt(v: Any, key: str = "") -> str:
    """A summary cell: in its unit (:data:`_SUMMARY_UNITS`, the unit in the label), else a
    float to 4 significant digits."""
    if v is None:
        return "—"
    unit = _SUMMARY_UNITS.get(key)
    if unit is not None and isinstance(v, int | float):
        return fmt_value(percent(v) if unit == "%" else v, unit, suffix=False)
    if isinstance(v, float):
        return fmt_value(v, "")
    return str(v)


def summary_markdown(
    run_id: str,
    probe: int,
    rows: list[dict[str, Any]],
    columns: tuple[tuple[str, str], ...] = SUMMARY_COLUMNS,
    loss: LabelLoss | None = None,
) -> str:
    """A markdown table of the snapshot rows, with scope and normalization stated above it
    (``columns``: a language model's run has its own, :data:`TOKEN_SUMMARY_COLUMNS`; a
    classifier's under another loss, :data:`_LOSS_SUMMARY_COLUMNS` with ``loss``)."""
    head = "| " + " | ".join(label for _, label in columns) + " |"
    rule = "|" + "---|" * len(columns)
    body = ["| " + " | ".join(_fmt(row.get(k), k) for k, _ in columns) + " |" for row in rows]
    if columns is _LOSS_SUMMARY_COLUMNS:
        said = loss.describe() if loss is not None else "the run's [loss]"
        return "\n".join(
            [
                f"# Curvature of run {run_id}",
                "",
                f"Probe: first {probe} fitting examples; float64; dense evaluation (gain one). "
                f"The loss: {said}; the diagonals are of that loss as reduced "
                "(fathom.losses.kinds.NORMALIZATION). Traces are exact weight diagonals "
                "summed over every layer (biases excluded). KFAC diag err (mean reduction "
                "only) is against this loss's exact GGN diagonal; the output mismatch is "
                "softmax cross-entropy's and is not computed.",
                "",
                head,
                rule,
                *body,
                "",
            ]
        )
    if columns is not SUMMARY_COLUMNS:
        return "\n".join(
            [
                f"# Curvature of run {run_id}",
                "",
                f"Probe: first {probe} fitting windows; float64; dense evaluation (gain one). "
                "The run's loss: token cross-entropy, mean over the valid positions. Traces "
                "sum every parameter's diagonal (weights and biases); SE: the GGN trace's "
                "standard error when it is sampled (blank when exact).",
                "",
                head,
                rule,
                *body,
                "",
            ]
        )
    return "\n".join(
        [
            f"# Curvature of run {run_id}",
            "",
            f"Probe: first {probe} fitting examples; float64; dense evaluation (gain one). "
            "Traces are exact weight diagonals summed over every layer (biases excluded), "
            "means over the probe. KFAC diag err is the relative L1 error of diag(G)⊗diag(A) "
            "against the exact CE-GGN diagonal. rho = C / effective_rank(L).",
            "",
            head,
            rule,
            *body,
            "",
        ]
    )


def _snapshot_record(rd: RunDir, e: int, snap, model, x, probe: int, probe_hash: str) -> dict:
    """One epoch's JSON record: checkpoint, provenance, scope, the snapshot, environment
    (``compute_s`` still inside; the caller moves it into ``runtime_s``)."""
    return _record_around(
        rd, e, snap.record, model, x, probe, probe_hash, prediction_agreement(snap.logits, model, x)
    )


def _record_around(
    rd: RunDir, e: int, body: dict, model, x, probe: int, probe_hash: str, agreement: dict | None
) -> dict:
    """The checkpoint, provenance, scope and environment around a snapshot's ``body``."""
    entry = rd.header.checkpoints.get(str(e))
    return {
        "format": _FORMAT,
        "kind": "fathom.curvature.snapshot",
        "run_id": rd.run_id,
        "run_dir": str(rd.path),
        "epoch": e,
        "checkpoint": {
            "file": None if entry is None else entry.file,
            "params_sha256": rd.checkpoint_hash(e),
            "verified": True,
            "converted_to": "float64",
        },
        "provenance": {
            "source_sha256": source_hash(),
            "checkpoint_sha256": rd.checkpoint_hash(e),
            "prediction_agreement": agreement,
        },
        "model_type": type(model).__name__,
        "scope": {
            "split": "fit",
            "probe": f"first {probe} examples of the fitting split, stored order",
            "N": probe,
            "probe_sha256": probe_hash,
        },
        **body,
        "environment": {
            "torch": torch.__version__,
            "device": str(x.device),
            "threads": torch.get_num_threads(),
            "platform": platform.platform(),
        },
    }


def run_curvature(
    rd: RunDir,
    epochs: Sequence[int] | None,
    probe: int = 128,
    out_dir: str | Path | None = None,
    device: str = "cpu",
    save_diagonals: bool = False,
    progress: Say | None = None,
    estimator: Estimating | None = None,
    loss: Any = None,
) -> list[dict[str, Any]]:
    """Compute and write one snapshot per epoch of run directory ``rd``; return the summary rows.

    ``loss``: a classifier's loss (a :class:`fathom.config.run.LossConfig`, e.g. from
    ``--loss``; default the run's own ``[loss]``, cross-entropy when it has none); every record
    says it (``loss``). Plain cross-entropy gives the full snapshot
    (:func:`~fathom.curvature.snapshot.curvature_snapshot`), another loss its exact diagonals
    (:func:`~fathom.curvature.snapshot.loss_snapshot`). A language model's run takes none.

    ``estimator``: how a language model's GGN diagonal is estimated (:class:`Estimating`,
    default ``auto`` under the default budget); a classifier's snapshot is exact throughout,
    and a sampled estimator asked of it is refused.

    ``rd`` is a :class:`fathom.rundir.RunDir` (``checkpoint_epochs``, ``checkpoint_hash``,
    ``load_state``, ``load_model``, ``load_splits``, ``manifest``, ``run_id``, ``path``).
    ``progress`` gets one line per snapshot written: k/N, elapsed and ETA
    (:class:`fathom.base.terminal.Tally`). The output is written under the run's lock
    (:func:`fathom.rundir.output.analysis_output`): refused while a trainer or another
    analysis writes the run, before anything is computed.
    """
    chosen = check_epochs(rd.checkpoint_epochs(), epochs)
    tokens = is_language_model(rd)
    if not tokens and estimator is not None and estimator.name not in ("auto", "exact"):
        raise FathomError(
            f"--estimator {estimator.name}: a classifier run's curvature snapshot is exact "
            "throughout (KFAC, mismatch and Grams need every direction); the estimators "
            "apply to a language model's run; drop --estimator"
        )
    if tokens and loss is not None:
        raise FathomError(
            "a language model's curvature is of its own loss, token cross-entropy; drop "
            "--loss, --reduction, --label-smoothing, --ignore-index and --target"
        )
    spec = rd.config.loss if loss is None else loss
    label_loss = None if tokens else spec if isinstance(spec, LabelLoss) else LabelLoss.of(spec)
    for e in chosen:  # verify every hash before computing (or writing) anything
        rd.load_state(e)
    # a locked or read-only run: say so (and how to fix it) before computing
    with analysis_output(Path(rd.path), "curvature", out_dir) as out:
        if tokens:
            return _write_token_snapshots(
                rd, chosen, probe, out, device, estimator or Estimating(), progress
            )
        assert label_loss is not None
        return _write_snapshots(
            rd, chosen, probe, out, device, save_diagonals, progress, label_loss
        )


@dataclass(frozen=True)
class Estimating:
    """How ``fathom curvature`` estimates a language model's GGN diagonal: ``name``
    (``auto``, ``exact``, ``mc``, ``hutchinson``), ``samples`` per window (per probe for
    Hutchinson), ``seed``, and the budget ``auto`` chooses under
    (:class:`fathom.curvature.estimate.Budget`: memory, backward passes)."""

    name: str = "auto"
    samples: int = 8
    seed: int = 0
    memory: str = "4GB"
    backward_passes: int = 2048


TOKEN_SUMMARY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("epoch", "epoch"),
    ("probe_ce_mean", "probe CE (nats/token)"),
    ("probe_ppl", "probe ppl"),
    ("ggn_trace", "GGN tr"),
    ("ggn_trace_se", "GGN tr SE"),
    ("empirical_fisher_trace", "EF tr"),
    ("estimator", "GGN estimator"),
    ("samples", "samples"),
    ("seed", "seed"),
    ("runtime_s", "runtime (s)"),
)


def is_language_model(rd: RunDir) -> bool:
    from fathom.config.model_kinds import model_kind

    return model_kind(rd.config.model.kind).tokens


def _write_token_snapshots(
    rd: RunDir,
    chosen: list[int],
    probe: int,
    out: AnalysisOutput,
    device: str,
    how: Estimating,
    progress: Say | None,
) -> list[dict[str, Any]]:
    """A language model's snapshots (module docstring; :func:`fathom.curvature.language.token_snapshot`)."""
    from fathom.base.terminal import Tally
    from fathom.curvature.estimate import Budget
    from fathom.curvature.language import token_snapshot
    from fathom.models.gpt import token_loss

    splits = rd.load_splits(device=device)
    x, y = probe_from_split(splits.fit_x, splits.fit_y, probe)
    probe_hash = tensor_digest([("x", x), ("y", y)])
    budget = Budget(memory=how.memory, backward_passes=how.backward_passes)
    rows, tally = [], Tally(len(chosen), "snapshots")
    for e in chosen:
        t0 = time.perf_counter()
        model = rd.load_model(e, dtype=torch.float32, device=device)
        t_load = time.perf_counter() - t0
        body = token_snapshot(
            model,
            x,
            y,
            loss=token_loss(),
            estimator=how.name,
            samples=how.samples,
            seed=how.seed,
            budget=budget,
        )
        body["budget"] = {"memory": how.memory, "backward_passes": how.backward_passes}
        record = _record_around(rd, e, body, model, x, probe, probe_hash, None)
        record["scope"]["probe"] = f"first {probe} windows of the fitting split, stored order"
        record["runtime_s"] = {
            "load_s": t_load,
            "compute_s": record.pop("compute_s"),
            "total_s": time.perf_counter() - t0,
        }
        out.json(f"epoch-{e:04d}.json", record)
        rows.append(
            {
                "epoch": e,
                "probe_ce_mean": record["probe_ce_mean"],
                "probe_ppl": record["probe_ppl"],
                "ggn_trace": record["traces"]["ggn"],
                "ggn_trace_se": record["trace_standard_errors"]["ggn"],
                "empirical_fisher_trace": record["traces"]["empirical_fisher"],
                "estimator": record["estimator"]["ggn"],
                "samples": record["samples"],
                "seed": record["seed"],
                "runtime_s": record["runtime_s"]["total_s"],
                "params_sha256": record["checkpoint"]["params_sha256"],
            }
        )
        if progress is not None:
            progress(f"{rd.run_id} epoch {e}: {record['runtime_s']['total_s']:.1f}s  {tally.add()}")
    summary = {
        "format": _FORMAT,
        "kind": "fathom.curvature.summary",
        "run_id": rd.run_id,
        "scope": {"split": "fit", "N": probe, "probe_sha256": probe_hash},
        "source_sha256": source_hash(),
        "normalization": "token cross-entropy, mean over the valid positions of the probe",
        "rows": rows,
    }
    out.json("summary.json", summary)
    out.text("summary.md", summary_markdown(rd.run_id, probe, rows, TOKEN_SUMMARY_COLUMNS))
    return rows


def _write_snapshots(
    rd: RunDir,
    chosen: list[int],
    probe: int,
    out: AnalysisOutput,
    device: str,
    save_diagonals: bool,
    progress: Say | None,
    loss: LabelLoss,
) -> list[dict[str, Any]]:
    from fathom.base.terminal import Tally

    splits = rd.load_splits(device=device)
    x, y = probe_from_split(splits.fit_x, splits.fit_y, probe)
    probe_hash = tensor_digest([("x", x), ("y", y)])
    rows = []
    tally = Tally(len(chosen), "snapshots")
    for e in chosen:
        t0 = time.perf_counter()
        model = rd.load_model(e, dtype=torch.float32, device=device)
        t_load = time.perf_counter() - t0
        if loss.is_default:
            snap = curvature_snapshot(model, x, y)
        else:
            snap = loss_snapshot(model, x, y, loss)
        record = _snapshot_record(rd, e, snap, model, x, probe, probe_hash)
        record["loss"] = loss.record()
        if save_diagonals:
            record["diagonals_file"] = _save_diagonals(
                out, f"epoch-{e:04d}.diagonals.safetensors", snap
            )
        record["runtime_s"] = {
            "load_s": t_load,
            "compute_s": record.pop("compute_s"),
            "total_s": time.perf_counter() - t0,
        }
        out.json(f"epoch-{e:04d}.json", record)
        rows.append(_summary_row(e, record))
        if progress is not None:
            progress(f"{rd.run_id} epoch {e}: {record['runtime_s']['total_s']:.1f}s  {tally.add()}")
    summary = {
        "format": _FORMAT,
        "kind": "fathom.curvature.summary",
        "run_id": rd.run_id,
        "scope": {"split": "fit", "N": probe, "probe_sha256": probe_hash},
        "source_sha256": source_hash(),
        "normalization": NORMALIZATION if loss.is_default else LOSS_NORMALIZATION,
        "loss": loss.record(),
        "rows": rows,
    }
    out.json("summary.json", summary)
    columns = SUMMARY_COLUMNS if loss.is_default else _LOSS_SUMMARY_COLUMNS
    out.text("summary.md", summary_markdown(rd.run_id, probe, rows, columns, loss))
    return rows


def prediction_agreement(logits64: torch.Tensor, model32: torch.nn.Module, x: torch.Tensor) -> dict:
    """The float64 probe logits against the recorded float32 model's on the same probe.

    ``argmax_agreement`` is the fraction of examples with the same predicted class;
    ``max_abs_logit_diff = max_ic |z64_ic - z32_ic|`` (float32 rounding, typically ~1e-6
    relative; a large value means the float64 copy does not compute what was recorded).
    """
    with dense_eval(model32), torch.no_grad():
        logits32 = model32(x).to(torch.float64)
    diff = (logits64 - logits32).abs()
    return {
        "compared": "float64 probe model vs recorded float32 model, dense evaluation, same probe",
        "argmax_agreement": float((logits64.argmax(1) == logits32.argmax(1)).double().mean()),
        "max_abs_logit_diff": float(diff.max()),
        "max_abs_logit": float(logits64.abs().max()),
    }


def _save_diagonals(out: AnalysisOutput, name: str, snap: Any) -> str:
    from safetensors.torch import save

    tensors = {
        f"{kind}/{name}": t.detach().cpu().contiguous()
        for kind, per in snap.diagonals.items()
        for name, t in per.items()
    }
    out.bytes(
        name,
        save(
            tensors,
            metadata={
                "normalization": "mean over the N probe examples",
                "keys": f"<{'|'.join(CURVATURE_FAMILIES)}>/<parameter name of model.named_parameters()>",
            },
        ),
    )
    return name


def load_diagonals(path: str | Path) -> dict[str, dict[str, torch.Tensor]]:
    """``{family: {param_name: diagonal}}`` of an ``epoch-NNNN.diagonals.safetensors`` file,
    families in :data:`fathom.curvature.exact.CURVATURE_FAMILIES` order; a file written before the rename
    (key prefixes ``fisher/``, ``jacobian/``: :data:`~fathom.curvature.exact.OLD_NAMES`) reads
    under the current names. A key of no family is refused, naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except (OSError, SafetensorError) as e:  # missing, or not a safetensors file
        raise FathomError(f"cannot read curvature diagonals {path}: {e}") from e
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        family, _, name = key.partition("/")
        family = OLD_NAMES.get(family, family)
        if family not in CURVATURE_FAMILIES or not name:
            raise FathomError(
                f"{path}: key {key!r} is not <family>/<parameter> with a family of "
                f"{', '.join(CURVATURE_FAMILIES)}; is this a fathom diagonals file?"
            )
        out.setdefault(family, {})[name] = t
    return {k: out[k] for k in CURVATURE_FAMILIES if k in out}
