"""Qualification: the same run with telemetry off and on must end byte-identical.

``qualify(cfg, out_dir)`` trains ``cfg`` twice (``out_dir/off``, ``out_dir/on``) and checks

* final parameters: equal ``state_dict_digest`` (byte-identical weights);
* scientific history: every field of every telemetry-off row (all but ``clock/*``) is equal
  in the telemetry-on row of the same epoch (telemetry-only epochs add rows, never change one);
* overhead: ``telemetry clock / training clock`` of the on run, with the cold first
  observation also reported separately, against ``gate`` (default 0.10). By default the
  gated ratio includes the cold start; ``exclude_cold=True`` gates the steady-state ratio
  ``(telemetry - cold) / training`` instead.

The result is written to ``out_dir/qualification.json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fathom.base.io import atomic_write_json
from fathom.config import RunConfig
from fathom.errors import FathomError
from fathom.rundir.record import RunManifest
from fathom.telemetry.registry import FAMILIES, field_for

DEFAULT_GATE = 0.10


@dataclass(frozen=True)
class Qualification:
    final_params_off: str | None
    final_params_on: str | None
    params_identical: bool
    history_mismatches: list[str]
    training_s: float
    telemetry_s: float
    telemetry_cold_s: float | None
    overhead: float | None  # telemetry_s / training_s
    overhead_without_cold: float | None  # (telemetry_s - cold) / training_s
    gate: float
    gated_on: str  # "including cold start" | "excluding cold start"
    passed: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_scientific(name: str) -> bool:
    """Fields compared between the off and on runs: everything except clocks and the
    selectable telemetry families (the trainer's own fields, declared in the registry too,
    are compared; an undeclared name is compared)."""
    if name.startswith("clock/"):
        return False
    try:
        return field_for(name).family not in FAMILIES
    except FathomError:
        return True


def history_mismatches(off: list[dict[str, Any]], on: list[dict[str, Any]]) -> list[str]:
    """Differences in scientific fields between the two histories (empty = identical)."""
    by_epoch = {row["epoch"]: row for row in on}
    bad: list[str] = []
    for row in off:
        other = by_epoch.get(row["epoch"])
        if other is None:
            bad.append(f"epoch {row['epoch']}: missing from the telemetry-on history")
            continue
        for key, value in row.items():
            if is_scientific(key) and other.get(key, "<absent>") != value:
                bad.append(
                    f"epoch {row['epoch']} {key}: off {value!r}, on {other.get(key, '<absent>')!r}"
                )
    return bad


def _overhead_ratios(
    manifest: RunManifest,
) -> tuple[float, float, float | None, float | None, float | None]:
    """``(training_s, telemetry_s, cold_s, overhead, overhead_without_cold)`` of a finished
    run, as its manifest recorded them (the ratios: the manifest's ``telemetry``
    section, :mod:`fathom.train.session`)."""
    clocks, tel = manifest.clocks, manifest.telemetry
    training, telemetry = float(clocks.training_s or 0.0), float(clocks.telemetry_s or 0.0)
    return (
        training,
        telemetry,
        clocks.telemetry_cold_s,
        tel.overhead_ratio,
        tel.overhead_ratio_without_cold,
    )


def qualify(
    cfg: RunConfig,
    out_dir: str | Path,
    *,
    gate: float = DEFAULT_GATE,
    exclude_cold: bool = False,
    splits: Any = None,
) -> Qualification:
    """Train ``cfg`` with telemetry off, then on; compare and gate (see the module docstring)."""
    from fathom.rundir import RunDir
    from fathom.train.loop import train

    out_dir = Path(out_dir)
    off = train(cfg, out_dir / "off", splits=splits, telemetry=False)
    on = train(cfg, out_dir / "on", splits=splits, telemetry=True)
    mismatches = history_mismatches(off.history, on.history)
    if off.status != "complete" or on.status != "complete":
        mismatches.insert(0, f"run status off={off.status}, on={on.status} (both must be complete)")
    training, telemetry, cold, overhead, steady = _overhead_ratios(RunDir(on.run_dir).record)
    gated = steady if exclude_cold else overhead
    identical = off.final_params is not None and off.final_params == on.final_params
    result = Qualification(
        final_params_off=off.final_params,
        final_params_on=on.final_params,
        params_identical=identical,
        history_mismatches=mismatches,
        training_s=training,
        telemetry_s=telemetry,
        telemetry_cold_s=cold,
        overhead=overhead,
        overhead_without_cold=steady,
        gate=gate,
        gated_on="excluding cold start" if exclude_cold else "including cold start",
        passed=identical and not mismatches and gated is not None and gated <= gate,
    )
    atomic_write_json(out_dir / "qualification.json", result.as_dict())
    return result
