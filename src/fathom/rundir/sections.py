"""The typed sections of a training run's manifest (``docs/architecture.md``, run directory).

Each section is a pydantic model whose fields carry their meaning. Which sections accept
keys they do not declare is decided here, per section, and nowhere else:

* **closed** (``extra="forbid"``): ``hashes``, ``model``, ``environment``, ``execution``,
  ``stop``, ``final``, ``selected``, ``failure``, ``source_changes``, ``integrity``,
  ``data`` (but ``data.info``, see below) -- a key Fathom does not write there is a damaged or
  foreign manifest, refused on read;
* **open by design**: ``data.info`` (what a data source records about itself, e.g. a user's
  factory), ``clocks`` (further clocks a stepper keeps, each a number of seconds or ``null``),
  ``telemetry.layers[*]`` (per-layer details an instrument adds), ``live`` (the settings are
  validated by :class:`fathom.config.LiveConfig` where they are used, so that a manifest stays
  readable when those settings evolve), weights entries and recovery events (details per
  event), and the manifest's top level (sections of other kinds and tools round-trip
  unchanged, :class:`fathom.rundir.record.RunManifest`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    SerializerFunctionWrapHandler,
    model_serializer,
)


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Sizes(_Closed):
    """Examples per split as the run trains and evaluates on them."""

    fit: NonNegativeInt
    val: NonNegativeInt
    test: NonNegativeInt


class Data(_Closed):
    """What the run trained on.

    ``dataset``: the config's dataset name; ``files``: ``{file: sha256}`` of the dataset files
    read (empty for data given in memory); ``split_mode`` / ``split_seed``: how the splits were
    drawn; ``split_hash``: digest of the split indices; ``tensors_sha256``: digest of the six
    split tensors' content (:func:`fathom.data.splits.splits_digest`); ``sizes``; ``info``:
    what the source records about itself (``classes``, ``in_features``, ``input_shape``,
    ``input_dtype`` always; more per source), from which ``RunDir.build_model`` rebuilds the
    model.
    """

    dataset: str
    files: dict[str, str]
    split_mode: str | None
    split_seed: int | None
    split_hash: str | None
    tensors_sha256: str
    sizes: Sizes
    info: dict[str, Any]


class ModelRecord(_Closed):
    """``kind`` (the config's ``model.kind``), ``class`` (the module's class name) and
    ``parameters`` (number of scalar parameters)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    kind: str
    class_: str = Field(alias="class")
    parameters: NonNegativeInt


class Hashes(_Closed):
    """Digests that pin what was trained.

    ``initial_params`` / ``final_params``: :func:`fathom.base.io.state_dict_digest` of the weights
    before training and at the end (``null`` unless the run completed); ``training_order`` /
    ``masks``: running ``sha256(prev || payload)`` chains over every epoch's example order and
    kept-branch bits up to ``epochs_completed`` (:func:`fathom.train.state.chain`).
    """

    initial_params: str
    final_params: str | None = None
    training_order: str
    masks: str


class Environment(_Closed):
    """Where it ran (:func:`fathom.base.provenance.environment`): interpreter and library versions,
    platform, CPU count, ``threads`` (torch's intra-op threads, kept on resume), ``device`` and
    its name, ``dtype``, ``matmul_precision``, ``cuda`` (``null`` on CPU),
    ``cpu_allocator_tuned`` (whether :func:`fathom.train.allocator.tune_cpu_allocator` applied)."""

    python: str
    torch: str
    numpy: str
    platform: str
    machine: str
    cpu_count: int | None
    threads: int
    device: str
    device_name: str
    dtype: str
    matmul_precision: str
    cuda: str | None
    cpu_allocator_tuned: bool


class Clocks(BaseModel):
    """Seconds, never interchanged (DESIGN.md, Clocks); ``null`` before the first boundary.

    ``training_s``: optimizer steps only (synchronized on GPU); ``training_cpu_s``: the
    training thread's CPU time (``time.thread_time``) of the same steps; ``evaluation_s`` and
    ``telemetry_s``: their own work; ``telemetry_cold_s``: the telemetry clock's first
    (discovery) boundary, ``null`` if none; ``checkpoint_s``: weights and resume-state writes;
    ``elapsed_s``: wall time of every invocation, set-up included. Further clocks (open
    section) are numbers of seconds or ``null``.
    """

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, float | None]

    training_s: float | None = None
    training_cpu_s: float | None = None
    evaluation_s: float | None = None
    telemetry_s: float | None = None
    telemetry_cold_s: float | None = None
    checkpoint_s: float | None = None
    elapsed_s: float | None = None


class LayerRecord(BaseModel):
    """An instrumented layer: ``name``, module ``type``, seam ``kind`` and ``params``
    (qualified parameter name -> shape); open for per-layer details."""

    model_config = ConfigDict(extra="allow")

    name: str
    type: str
    kind: str
    params: dict[str, list[int]]


class SchemaChange(_Closed):
    """One change of the telemetry field set between observations (a structure change
    mid-run: a layer unfrozen, a head swapped): the ``epoch`` observed with the new set
    (``null`` when the change was seen outside an observation), the instrumented ``layers``
    from then on, and the history fields ``added`` and ``removed``."""

    epoch: int | None
    layers: list[str]
    added: list[str]
    removed: list[str]


class Telemetry(_Closed):
    """``enabled``; ``total_s`` (telemetry clock), ``cold_s`` (its first boundary),
    ``overhead_ratio`` = telemetry clock / training clock and ``overhead_ratio_without_cold``
    = (telemetry - cold) / training (``null`` before any training time); ``layers``: the
    instrumented layers (``null`` before discovery or without telemetry);
    ``schema_changes``: the recorder's :class:`SchemaChange` records, oldest first (``[]``
    when the field set never changed, ``null`` without telemetry); ``families_left_out``: the
    families an alias (``all``, ``cheap``) named that do not apply to the model, each with
    its reason (a language model's ``[N, T, V]`` logits; ``null`` when none was left out)."""

    enabled: bool
    total_s: float | None = None
    cold_s: float | None = None
    overhead_ratio: float | None = None
    overhead_ratio_without_cold: float | None = None
    layers: list[LayerRecord] | None = None
    schema_changes: list[SchemaChange] | None = None
    families_left_out: dict[str, str] | None = None


class Execution(_Closed):
    """How the steps ran: ``path`` (``eager`` | ``graph`` | ``regularized``), ``precision``
    (``fp32`` | ``tf32`` | ``bf16``), ``note`` (why a faster path was not taken, or ``null``),
    ``graph_limit_branches`` (the config's bound on branches captured in CUDA graphs) and
    ``graphs_captured`` (how many were captured, ``null`` before the first boundary)."""

    path: str
    precision: str
    note: str | None = None
    graph_limit_branches: int | None = None
    graphs_captured: int | None = None


class Live(BaseModel):
    """This invocation's ``[live]`` settings (not in ``config`` / ``config_hash``: they never
    train): ``backends`` streamed to, and per backend its settings (open section)."""

    model_config = ConfigDict(extra="allow")

    backends: list[str] = Field(default_factory=list)


class Selected(_Closed):
    """The epoch of minimum validation objective so far
    (:func:`fathom.config.run.objective_field`) and the validation cross entropy of the logits
    there, ``val_ce`` (nats); for a run with a ``[loss]`` table, also ``val_loss``, that loss
    over the validation split, the value it was selected by (written only then, so the
    manifest of a default run is as before). ``null`` before the first evaluated boundary."""

    epoch: int | None = None
    val_ce: float | None = None
    val_loss: float | None = None

    @model_serializer(mode="wrap")
    def _val_loss_when_set(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if self.val_loss is None:
            data.pop("val_loss", None)
        return data


class Final(_Closed):
    """``epoch`` of the final weights (``null`` unless the run completed)."""

    epoch: int | None = None


class Stop(_Closed):
    """A reached target stopped the run: ``target_test_acc`` (fraction), the ``epoch`` it was
    first reached, and the training and elapsed clocks at that boundary (seconds)."""

    target_test_acc: float
    epoch: int
    training_s: float
    elapsed_s: float


class Failure(_Closed):
    """Why a ``failed`` run failed (:func:`fathom.rundir.writer.failure_record`): exception
    ``type``, ``errno`` name or ``null``, ``environment``: the machine failed (full disk,
    read-only file system), not the run."""

    type: str
    errno: str | None
    environment: bool


class SourceChange(_Closed):
    """The source hash the run continued with ``from_epoch`` on (``--allow-source-change``)."""

    from_epoch: int
    source_hash: str


class WeightsEntry(BaseModel):
    """A weights file the manifest lists: ``file`` (relative to the run), ``params_sha256``
    (:func:`fathom.base.io.state_dict_digest` of its tensors), ``sha256`` of the whole file
    (absent in manifests written before it was recorded) and, for the selected weights,
    ``epoch``."""

    model_config = ConfigDict(extra="allow")

    file: str
    params_sha256: str
    sha256: str | None = None
    epoch: int | None = None


class RecoveryEvent(BaseModel):
    """One thing a writer found and repaired: ``event`` and its details (see
    :data:`fathom.rundir.manifest.RECOVERY_SENTENCES`)."""

    model_config = ConfigDict(extra="allow")

    event: str


class HistoryRecord(_Closed):
    """``bytes``, ``rows`` and ``sha256`` of the first ``bytes`` bytes of ``history.jsonl``."""

    bytes: NonNegativeInt
    rows: NonNegativeInt
    sha256: str


class Integrity(_Closed):
    """``manifest_sha256`` (canonical JSON of the manifest without this key) and the
    ``history`` prefix it covers; set by every commit (:meth:`RunWriter.commit`)."""

    manifest_sha256: str
    history: HistoryRecord


Phase = Literal["tuning", "main", "diagnostic"]
Status = Literal["running", "interrupted", "complete", "diverged", "failed"]
"""A run's status: ``running`` while a writer trains it (or until a killed writer's run is
resumed: a reader tells the two apart by the run's lock, :func:`fathom.rundir.state.run_state`),
``interrupted`` after Ctrl-C or SIGTERM (resumable), then its outcome."""
UNFINISHED: tuple[Status, ...] = ("running", "interrupted")
"""The statuses of a run cut short or still training: no final result, resumable."""
