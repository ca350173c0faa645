"""The typed manifest of a training run (kind ``run``), as :class:`RunWriter` builds and
writes it and :func:`fathom.rundir.manifest.check_manifest` validates it on every read of a
manifest of format 3 or later. Sections: :mod:`fathom.rundir.sections`.
Also the typed records of a run's other JSON outputs: :class:`CurvatureRecord` and
:class:`AuditRecord` (read by :func:`fathom.rundir.reader.read_curvature` and
:func:`fathom.rundir.reader.read_audit`), and :class:`RecordedRun`: the fields a resume and
an analysis compare with what they find, read the same way from a manifest of any format
(formats 1 and 2 may lack any of them; ``RunDir.recorded``).

The manifest's top level is open: a section this version does not declare (written by
another kind or tool) is kept and written back unchanged. ``stop``, ``failure``,
``source_changes``, ``recovery`` and ``integrity`` are written only when they hold something
(a run that no target stopped has no ``stop``), every other field always, ``null`` included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fathom.errors import FathomError
from fathom.rundir.header import ManifestHeader
from fathom.rundir.sections import (
    Clocks,
    Data,
    Environment,
    Execution,
    Failure,
    Final,
    Hashes,
    Integrity,
    Live,
    ModelRecord,
    Selected,
    SourceChange,
    Stop,
    Telemetry,
    WeightsEntry,
)

#: Sections written only when set (see the module docstring).
_WRITTEN_WHEN_SET = ("stop", "failure", "source_changes", "recovery", "integrity")


class RunManifest(ManifestHeader):
    """Everything a training run's ``manifest.json`` holds (``docs/architecture.md``).

    Beyond the header (format, kind, phase, run_id, study, status and its reason, config,
    checkpoint entries, recovery events): ``config_hash`` (:func:`fathom.base.io.config_digest` of
    ``config``), ``source_hash`` (of the fathom source the run started with; later ones in
    ``source_changes``), ``data``, ``model``, ``hashes``, ``environment``, ``clocks``,
    ``epochs_completed`` / ``steps_completed`` (at the last complete epoch boundary),
    ``diverged_epoch`` (the epoch whose loss or parameters went non-finite, else ``null``),
    ``selected``, ``final``, ``telemetry``, ``live``, ``execution``, ``stop`` and
    ``failure``.
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    kind: str = "run"
    config_hash: str
    source_hash: str | None
    source_changes: list[SourceChange] | None = None
    failure: Failure | None = None
    data: Data
    model: ModelRecord
    hashes: Hashes
    environment: Environment
    clocks: Clocks = Field(default_factory=Clocks)
    epochs_completed: int = 0
    steps_completed: int = 0
    diverged_epoch: int | None = None
    selected: Selected = Field(default_factory=Selected)
    final: Final = Field(default_factory=Final)
    telemetry: Telemetry
    live: Live = Field(default_factory=Live)
    execution: Execution
    stop: Stop | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object written to ``manifest.json`` (without ``integrity``: the writer seals
        it), unknown top-level sections included."""
        out = self.model_dump(mode="json", by_alias=True, exclude={"integrity"})
        for key in _WRITTEN_WHEN_SET:
            if out.get(key) in (None, []):
                out.pop(key, None)
        return out


# -- what a run recorded, any format --------------------------------------------------------
class _Given(BaseModel):
    """A section as any manifest format recorded it: each field optional (formats 1 and 2 were
    written before some of them existed), keys this version does not compare ignored, and a
    section written as ``null`` read as absent. :meth:`given` tells a recorded field from an
    absent one: an absent field is never compared (it was not recorded), a recorded ``null``
    is. :meth:`as_json` is the section's object as written (every key, unvalidated): what a
    view that shows a section verbatim (a report's provenance, the W&B config) shows."""

    model_config = ConfigDict(extra="ignore")
    _json: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_as_written(cls, data: Any, handler: Any) -> Any:
        section = handler(data)
        if isinstance(data, dict):
            section._json = data
        return section

    def as_json(self) -> dict[str, Any]:
        """The section's object as the manifest records it (``{}`` where it records none); a
        copy, so that a caller's change reaches no other reader."""
        return dict(self._json)

    @model_validator(mode="before")
    @classmethod
    def _null_section_is_absent(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        sections = {
            name
            for name, field in cls.model_fields.items()
            if isinstance(field.annotation, type) and issubclass(field.annotation, _Given)
        }
        return {k: v for k, v in data.items() if not (v is None and k in sections)}

    def given(self) -> dict[str, Any]:
        """``{field: value}`` of the fields the manifest holds (``null`` ones included)."""
        return {name: getattr(self, name) for name in self.model_fields_set}


def _whole_number_or_none(value: Any) -> int | None:
    """A planned epoch count, or ``None`` (unknown) for anything that is not a whole number."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class RecordedInfo(_Given):
    """``data.info``: what the data source recorded about itself. Open (a source records more
    keys of its own, kept as written); the keys a reader acts on are typed: ``classes`` and
    ``in_features`` of the model's output and input, ``input_shape`` of one example,
    ``paths_base`` (the directory the config's relative data paths are relative to) and, for
    a language model's text, ``unigram_val_ce`` (nats/token of the unigram baseline on the
    validation tokens) and ``unigram_val_ppl`` (its perplexity, exp of it). Each is ``None`` where the manifest does not record it."""

    model_config = ConfigDict(extra="allow")

    classes: int | None = None
    in_features: int | None = None
    input_shape: list[int] | None = None
    paths_base: str | None = None
    unigram_val_ce: float | None = None
    unigram_val_ppl: float | None = None


class RecordedData(_Given):
    """``data``: the dataset files' ``{file: sha256}``, ``split_hash``, ``sizes`` per split,
    ``tensors_sha256`` of the split tensors and ``info`` (:class:`RecordedInfo`)."""

    files: dict[str, str] | None = None
    split_hash: str | None = None
    sizes: dict[str, int] | None = None
    tensors_sha256: str | None = None
    info: RecordedInfo = Field(default_factory=RecordedInfo)


class RecordedEnvironment(_Given):
    """``environment``: what CPU reductions and kernels depend on."""

    threads: int | None = None
    device: str | None = None
    matmul_precision: str | None = None


class RecordedHashes(_Given):
    """``hashes``: the initial parameters and the training-order and mask digest chains."""

    initial_params: str | None = None
    training_order: str | None = None
    masks: str | None = None


class RecordedOptim(_Given):
    """``config.optim``: the planned ``epochs`` (``None``: not a whole number, unknown), the
    learning rate ``lr`` and the ``batch_size``."""

    epochs: int | None = None
    lr: float | None = None
    batch_size: int | None = None

    @field_validator("epochs", mode="before")
    @classmethod
    def _plan(cls, value: Any) -> int | None:
        return _whole_number_or_none(value)


class RecordedCheckpointing(_Given):
    """``config.checkpoints``: a resume state is written every ``resume_every`` epochs."""

    resume_every: int = 1


class RecordedModel(_Given):
    """``config.model``: its ``kind`` and training ``recipe`` (``None`` where not recorded)."""

    kind: str | None = None
    recipe: str | None = None


class RecordedDataConfig(_Given):
    """``config.data``: the ``dataset`` name, its ``split`` (``fit-val``, ``fit-all``), a text
    corpus's ``context`` (tokens per window) and the ``fit_subset`` / ``eval_subset`` sizes."""

    dataset: str | None = None
    split: str | None = None
    context: int | None = None
    fit_subset: int | None = None
    eval_subset: int | None = None


class RecordedConfig(_Given):
    """The config fields read without validating the config (any kind): ``optim.epochs`` and
    ``optim.lr`` of a run, ``epochs`` of older kinds, ``checkpoints.resume_every``, the
    ``seed``, the ``model``'s kind and recipe, the ``data`` it names and the run's ``tags``. :meth:`as_json` is the whole config object
    as recorded (what a report shows and an export logs verbatim)."""

    optim: RecordedOptim = Field(default_factory=RecordedOptim)
    checkpoints: RecordedCheckpointing = Field(default_factory=RecordedCheckpointing)
    model: RecordedModel = Field(default_factory=RecordedModel)
    data: RecordedDataConfig = Field(default_factory=RecordedDataConfig)
    epochs: int | None = None
    seed: int | None = None
    tags: dict[str, Any] | None = None

    @field_validator("epochs", mode="before")
    @classmethod
    def _plan(cls, value: Any) -> int | None:
        return _whole_number_or_none(value)

    @property
    def planned_epochs(self) -> int | None:
        """The epochs the config plans: ``optim.epochs`` (a run), ``epochs`` (older kinds)."""
        return self.optim.epochs if "epochs" in self.optim.given() else self.epochs


class RecordedLayer(_Given):
    """One entry of ``telemetry.layers``: the instrumented layer's ``name`` (``None`` where
    not recorded); its other details are not read here."""

    name: str | None = None


class RecordedTelemetry(_Given):
    """``telemetry``: the instrumented ``layers`` in model order (``None`` before discovery,
    without telemetry, or in a manifest written before they were listed)."""

    layers: list[RecordedLayer] | None = None

    @property
    def layer_names(self) -> list[str] | None:
        """The named layers' names in model order; ``None`` when none is listed."""
        names = [layer.name for layer in self.layers or [] if layer.name]
        return names or None


class RecordedBuilt(_Given):
    """``model``: what was built, its scalar ``parameters`` count."""

    parameters: int | None = None


class RecordedExecution(_Given):
    """``execution``: the step ``path`` taken (``eager``, ``graph``, ``regularized``)."""

    path: str | None = None


class RecordedFinal(_Given):
    """``final``: the epoch of the final weights (``None`` unless the run completed)."""

    epoch: int | None = None


class RecordedSelected(_Given):
    """``selected``: the epoch of minimum validation cross entropy and that ``val_ce`` (nats),
    and ``val_loss`` (the validation value of a ``[loss]`` table's loss, where the run
    trained with one); ``None`` before the first evaluated boundary."""

    epoch: int | None = None
    val_ce: float | None = None
    val_loss: float | None = None


class RecordedFailure(_Given):
    """``failure`` of a failed run: the exception ``type`` and ``environment`` (the machine
    failed, not the run: a study retries it); a run that did not fail records none."""

    type: str | None = None
    environment: bool = False


class RecordedRun(_Given):
    """What a run's manifest recorded, typed the same way for every format: the one read path
    of the fields a resume verifies (:mod:`fathom.rundir.resume`) and an analysis compares
    (:mod:`fathom.rundir.inputs`), the ``live`` settings a resume continues with (open:
    validated by :class:`fathom.config.LiveConfig` where used), and what reports and exports
    read of a run (:mod:`fathom.report.runs`: identity, status, phase, study, the selected and
    final epochs, data sizes, telemetry layers, checkpoints, ``clocks``: ``{name: seconds}``
    in the order written, ``None`` where not recorded). A format-3 manifest holds every field
    (:class:`RunManifest`); one of format 1 or 2 may lack any, and a field it lacks is not
    compared (:meth:`_Given.given`). Parsed by :func:`fathom.rundir.manifest.read_recorded`,
    which refuses a section of the wrong shape naming it."""

    run_id: str
    study: str | None = None
    phase: str | None = None
    status: str | None = None
    status_reason: str | None = None
    config_hash: str | None = None
    source_hash: str | None = None
    source_changes: list[SourceChange] = Field(default_factory=list)
    epochs_completed: int | None = None
    steps_completed: int | None = None
    diverged_epoch: int | None = None
    config: RecordedConfig = Field(default_factory=RecordedConfig)
    data: RecordedData = Field(default_factory=RecordedData)
    model: RecordedBuilt = Field(default_factory=RecordedBuilt)
    telemetry: RecordedTelemetry = Field(default_factory=RecordedTelemetry)
    execution: RecordedExecution = Field(default_factory=RecordedExecution)
    environment: RecordedEnvironment = Field(default_factory=RecordedEnvironment)
    hashes: RecordedHashes = Field(default_factory=RecordedHashes)
    final: RecordedFinal = Field(default_factory=RecordedFinal)
    selected: RecordedSelected = Field(default_factory=RecordedSelected)
    failure: RecordedFailure = Field(default_factory=RecordedFailure)
    live: dict[str, Any] = Field(default_factory=dict)
    clocks: dict[str, int | float | None] | None = None
    checkpoints: dict[str, WeightsEntry] = Field(default_factory=dict)
    selected_checkpoint: WeightsEntry | None = None
    integrity: Integrity | None = None

    @field_validator("source_changes", "checkpoints", "live", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            return value
        return [] if info.field_name == "source_changes" else {}

    @property
    def done(self) -> int:
        """Completed epochs (``epochs_completed``; none recorded: 0)."""
        return self.epochs_completed or 0


@dataclass(frozen=True)
class CurvatureSummary:
    """``<run>/curvature/summary.json`` (:func:`fathom.curvature.rundir.run_curvature` writes
    it): the probe ``scope`` (split, ``N``, probe digest), the ``normalization`` sentence and one
    row per snapshot (``rows``, each with its ``epoch``). ``raw`` is the file's object, unchanged
    (keys this version does not name included)."""

    run_id: str
    rows: list[dict[str, Any]]
    scope: dict[str, Any]
    normalization: Any
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CurvatureSummary:
        return cls(
            run_id=data.get("run_id", ""),
            rows=list(data.get("rows", [])),
            scope=dict(data.get("scope", {})),
            normalization=data.get("normalization"),
            raw=data,
        )

    def by_epoch(self) -> dict[int, dict[str, Any]]:
        """``{epoch: row}`` of :attr:`rows`."""
        return {int(r["epoch"]): r for r in self.rows}


@dataclass(frozen=True)
class CurvatureRecord:
    """A run's curvature directory: ``summary`` (``None`` when ``summary.json`` is absent or
    unreadable) and ``epochs`` (``{epoch: epoch-NNNN.json object}``, the snapshots present)."""

    summary: CurvatureSummary | None
    epochs: dict[int, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        """``{"summary": summary.json object or None, "epochs": {epoch: object}}``."""
        return {
            "summary": None if self.summary is None else self.summary.raw,
            "epochs": self.epochs,
        }


class AuditedRun(BaseModel):
    """One row of ``audit.json``'s ``runs`` (:meth:`fathom.audit.run._Audit.run` writes it):
    the audited ``run_id``, its ``path`` (relative to the audited target), ``arm`` (the name
    its cohort is aggregated under), training ``recipe`` and ``seed``, ``status``,
    ``config_hash`` and ``split_hash`` as the run recorded them, and per requested checkpoint
    (``selected``, ``final``) its record in ``checkpoints`` (one holding ``missing`` was not
    audited: the reason) and its failure ``flags``. Open: a key this version does not name is
    kept, and the checkpoint records are read by their consumers (:mod:`fathom.audit`)."""

    model_config = ConfigDict(extra="allow")

    run_id: str
    path: str | None = None
    arm: str | None = None
    recipe: str
    seed: int
    status: str | None = None
    config_hash: str | None = None
    split_hash: str | None = None
    checkpoints: dict[str, dict[str, Any]] = Field(default_factory=dict)
    flags: dict[str, Any] = Field(default_factory=dict)

    def audited(self, which: str) -> dict[str, Any] | None:
        """The record of checkpoint ``which``, or ``None`` where it was not requested or not
        audited (its record says why it is ``missing``)."""
        rec = self.checkpoints.get(which)
        return None if rec is None or "missing" in rec else rec


@dataclass(frozen=True)
class AuditRecord:
    """``audit/audit.json`` of a run or study (:func:`fathom.audit.run.audit_runs` writes it):
    ``kind`` (``run`` or ``study``), the audited ``target``, ``settings``, per-run ``runs``
    rows (:class:`AuditedRun`), ``skipped`` runs, ``aggregate`` (across seeds, per checkpoint)
    and ``wall_s``. ``raw`` is the file's object, unchanged (what the renderers take)."""

    kind: str
    target: str
    settings: dict[str, Any]
    runs: list[AuditedRun]
    skipped: list[dict[str, Any]]
    aggregate: dict[str, Any]
    wall_s: float | None
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, data: dict[str, Any], origin: str = "audit.json") -> AuditRecord:
        """The record of ``data``; a row of ``runs`` of the wrong shape is refused naming it
        and ``origin`` (the file)."""
        runs = []
        for i, row in enumerate(data.get("runs", [])):
            try:
                runs.append(AuditedRun.model_validate(row))
            except ValidationError as e:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in err['loc']) or 'row'}: {err['msg']}"
                    for err in e.errors()
                )
                raise FathomError(
                    f"{origin}: runs[{i}] is not an audited run ({problems}); it was damaged "
                    "or written by another tool: audit again (fathom audit)"
                ) from None
        return cls(
            kind=data.get("kind", "study"),
            target=data.get("target", ""),
            settings=dict(data.get("settings", {})),
            runs=runs,
            skipped=list(data.get("skipped", [])),
            aggregate=dict(data.get("aggregate", {})),
            wall_s=data.get("wall_s"),
            raw=data,
        )
