"""The analyses of a run as scalar series: its curvature summary and its audit, per epoch.

Sources (the files the analyses wrote; nothing is recomputed):

* **curvature**: ``<run>/curvature/summary.json`` (:mod:`fathom.curvature.rundir`), one row per
  snapshot epoch -> ``curvature/<column>`` at step = epoch: the probe's mean CE (nats), its
  accuracy in percent (``curvature/probe_acc_pct``), the exact GGN, empirical-Fisher and
  logit-Jacobian weight traces, the largest KFAC diagonal error, rho and cheap rho, the
  snapshot's runtime (s);
* **audit**: the run's record in ``<run>/audit/audit.json`` (a one-run audit) or
  ``<study>/audit/audit.json`` (:mod:`fathom.audit.run`) -> at step = the checkpoint's
  epoch, for each audited checkpoint (``selected``, ``final``) and split (``val``,
  ``test``): every mask's accuracy (%), CE (nats) and damage (CE of the mask minus CE of
  the full network, nats; the run's ``[loss]`` where it has one) as ``audit/<checkpoint>/mask/<mask>/<split>/<acc_pct|ce|damage>``,
  every single-branch deletion as ``.../branch/<i>/...`` and the mean over the masks keeping
  ``k`` branches as ``.../kept/<k>/...``.

A source applies to the run only if it was computed from this run's weights: an audit record
whose run id or ``config_hash`` differs from the manifest's, or a row (curvature) or
checkpoint (audit) whose ``params_sha256`` differs from the one the manifest records for that
epoch, is left out and named in ``notes`` (a run trained again after its analysis). Each
source file's SHA-256 goes into the export's fingerprint, so a new analysis makes the export
stale.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fathom.base.io import sha256_file
from fathom.base.units import percent
from fathom.errors import FathomError
from fathom.report.runs import RunData
from fathom.rundir.record import AuditedRun, AuditRecord, CurvatureSummary

_CURVATURE_FILE = Path("curvature") / "summary.json"
_AUDIT_FILE = Path("audit") / "audit.json"
_AUDIT_SPLITS = ("val", "test")
_AUDIT_METRICS = {"acc": "acc_pct", "ce": "ce", "damage": "damage"}
_CURVATURE_SKIP = ("epoch", "params_sha256")

_CURVATURE_TEXT: dict[str, str] = {
    "probe_ce_mean": "mean CE over the curvature probe (nats)",
    "probe_acc_pct": "accuracy on the curvature probe (percent: 100 x the fraction)",
    "ggn_weight_trace": "exact trace of the CE generalized Gauss-Newton over the weights, "
    "(1/N) sum_i tr(J_i^T H_i J_i) (nats / parameter unit^2)",
    "empirical_fisher_weight_trace": "exact trace of the empirical Fisher over the weights, "
    "(1/N) sum_i ||g_i||^2 (nats^2 / parameter unit^2)",
    "jacobian_gram_weight_trace": "exact trace of the logit-Jacobian Gram over the weights, "
    "(1/N) sum_i ||J_i||_F^2 (logit^2 / parameter unit^2)",
    "kfac_diag_rel_l1_error_max": "largest over the layers of sum |diag(G) (x) diag(A) - "
    "diag(GGN)| / sum |diag(GGN)|",
    "rho": "C / effective_rank(eig(L)), L solving Hbar L + L Hbar = 2 F over the logits "
    "(fathom.curvature.mismatch)",
    "cheap_rho": "C / effective_rank(eig(Hs^-1/2 Ft Hs^-1/2)) (fathom.curvature.mismatch)",
    "runtime_s": "wall time of the snapshot (s)",
}
"""What each curvature column is (the full definitions: :mod:`fathom.curvature.definitions`)."""

_AUDIT_TEXT = {
    "acc_pct": "accuracy with the branches of the mask kept (percent: 100 x the fraction)",
    "ce": "mean CE with the branches of the mask kept (nats)",
    "damage": "the run's loss with the mask minus with the full network on the same split "
    "(CE in nats; a run with a [loss] table: that loss, named in audit.json's 'loss')",
}
_AUDIT_GROUPS = {
    "mask": "the mask {key} (1 = branch kept)",
    "branch": "branch {key} deleted, every other kept",
    "kept": "mean over the masks keeping {key} branches",
}


@dataclass
class Analyses:
    """A run's analysis scalars: ``tag -> [(epoch, value)]`` in export units, the source
    files with their SHA-256, and why any source was left out."""

    points: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, tag: str, epoch: int, value: Any) -> None:
        if isinstance(value, int | float) and not isinstance(value, bool):
            self.points.setdefault(tag, []).append((epoch, float(value)))


def _params_hash(run: RunData, epoch: int) -> str | None:
    entry = run.recorded.checkpoints.get(str(epoch))
    return None if entry is None else entry.params_sha256


def _same_weights(run: RunData, epoch: int, recorded: Any) -> bool:
    expected = _params_hash(run, epoch)
    return expected is None or recorded == expected


def _read(path: Path, out: Analyses) -> Any:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        out.notes.append(f"{path}: unreadable ({type(e).__name__}); left out")
        return None
    out.sources[str(path)] = sha256_file(path)
    return data


def _curvature(run: RunData, out: Analyses) -> None:
    path = run.path / _CURVATURE_FILE
    summary = _read(path, out) if path.exists() else None
    rows = CurvatureSummary.from_json(summary).rows if summary else []
    for row in rows:
        epoch = row.get("epoch")
        if not isinstance(epoch, int):
            continue
        if not _same_weights(run, epoch, row.get("params_sha256")):
            out.notes.append(
                f"run {run.run_id}: curvature at epoch {epoch} was computed from other weights "
                "than the checkpoint's; left out (compute it again: fathom curvature)"
            )
            continue
        for key, value in sorted(row.items()):
            if key in _CURVATURE_SKIP:
                continue
            if key == "probe_accuracy":
                key, value = "probe_acc_pct", percent(value) if value is not None else None
            out.add(f"curvature/{key}", epoch, value)


def _audit_record(run: RunData, out: Analyses) -> AuditedRun | None:
    """The run's row of its own audit, else of its study's (:class:`AuditedRun`, typed by the
    one reader's record); a file holding a malformed row is named in ``notes`` and left out."""
    for path in (run.path / _AUDIT_FILE, run.path.parent / _AUDIT_FILE):
        audit = _read(path, out) if path.exists() else None
        try:
            records = AuditRecord.from_json(audit, str(path)).runs if audit else []
        except FathomError as e:
            out.notes.append(f"{e}; left out")
            continue
        for record in records:
            if record.run_id != run.run_id:
                continue
            if record.config_hash != run.recorded.config_hash:
                out.notes.append(
                    f"run {run.run_id}: {path} audited another config; left out (audit again)"
                )
                return None
            return record
    return None


def _audit(run: RunData, out: Analyses) -> None:
    record = _audit_record(run, out)
    for which, ckpt in sorted((record.checkpoints if record else {}).items()):
        epoch = ckpt.get("epoch")
        if not isinstance(epoch, int):
            continue
        if not _same_weights(run, epoch, ckpt.get("params_sha256")):
            out.notes.append(
                f"run {run.run_id}: the audit of checkpoint {which!r} used other weights than "
                "the manifest records; left out (audit again)"
            )
            continue
        groups = {
            "mask": [(m.get("mask"), m) for m in ckpt.get("masks") or []],
            "branch": [(b.get("branch"), b) for b in ckpt.get("branches") or []],
            "kept": sorted((ckpt.get("by_size") or {}).items(), key=lambda kv: int(kv[0])),
        }
        for group, entries in groups.items():
            for key, entry in entries:
                for split in _AUDIT_SPLITS:
                    scores = entry.get(split) or {}
                    for name, exported in _AUDIT_METRICS.items():
                        v = scores.get(name)
                        if name == "acc" and isinstance(v, int | float):
                            v = percent(v)
                        out.add(f"audit/{which}/{group}/{key}/{split}/{exported}", epoch, v)


def run_analyses(run: RunData) -> Analyses:
    """The run's curvature and audit scalars (module docstring), each series in epoch order."""
    out = Analyses()
    _curvature(run, out)
    _audit(run, out)
    for series in out.points.values():
        series.sort(key=lambda p: p[0])
    return out


def describe(tag: str) -> str | None:
    """What an analysis tag is, or ``None`` for a tag that is not one."""
    parts = tag.split("/")
    if parts[0] == "curvature" and len(parts) == 2:
        text = _CURVATURE_TEXT.get(parts[1], f"the summary column {parts[1]!r}")
        return f"curvature snapshot: {text} [scope: probe of the fit split]"
    if parts[0] == "audit" and len(parts) == 6 and parts[2] in _AUDIT_GROUPS:
        _, which, group, key, split, metric = parts
        if metric in _AUDIT_TEXT:
            what = _AUDIT_GROUPS[group].format(key=key)
            return f"audit of the {which} checkpoint, {split} split, {what}: {_AUDIT_TEXT[metric]}"
    return None
