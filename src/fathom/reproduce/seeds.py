"""The seeds' published numbers as reference data (``seeds.toml``), validated on load.

Each :class:`SeedValue` is one number quoted from a seed report: its source (seed file and
section heading), units, the statistic it is, and ``extract``, the Fathom quantity computed
beside it by :mod:`fathom.reproduce.compare`. Each :class:`SeedTable` is one table of a seed
with the place its Fathom counterpart is written (a path template over ``{study}``,
``{runs}``, ``{head}``).
"""

from __future__ import annotations

from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fathom.config import parse_toml
from fathom.errors import FathomError, validation_message

_EXTRACT_KINDS: tuple[str, ...] = (
    "study",
    "study_diff",
    "study_clock",
    "manifest_stat",
    "telemetry_layers",
    "audit_size",
    "audit_size_diff",
    "audit_branch",
    "audit_interactions",
    "curvature",
    "curvature_ratio",
    "curvature_field_ratio",
    "curvature_max",
    "head",
    "none",
)
"""The Fathom quantities a seed value of a study table can be set beside
(:mod:`fathom.reproduce.extract`)."""

_DEPTH_KINDS: tuple[str, ...] = ("depth_arm", "depth_delta", "depth_change")
"""Those of a depth-scaling table (:mod:`fathom.reproduce.depth_compare`)."""

_PROTOCOLS: dict[str, tuple[str, ...]] = {
    "study": _EXTRACT_KINDS,
    "depth_scaling": (*_DEPTH_KINDS, "none"),
}
"""Which pipeline computes a table's counterparts: a study (``fathom reproduce quick``,
``seed-003``) or a depth-scaling benchmark (``seed-000``); each has its extract kinds."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SeedTable(_Strict):
    id: str
    seed: str
    section: str = Field(min_length=1)
    title: str
    counterpart: str
    protocol: Literal["study", "depth_scaling"] = "study"
    # the seed's own verbal conclusion from this table, verbatim (set beside Fathom's verdict)
    conclusion: str | None = None
    # a cross-run table (fathom.report.crossrun) printed whole as Fathom's side, for a seed
    # table whose numbers the seed's text does not give
    fathom_table: str | None = None
    # the epoch the seed's protocol ended at: what its "epoch 100" / "final checkpoint" /
    # "after five epochs" rows mean (Fathom's own epoch is read from its outputs)
    epochs: int | None = Field(default=None, ge=0)


class SeedValue(_Strict):
    id: str
    table: str
    seed: str
    section: str = Field(min_length=1)
    quantity: str
    value: float | tuple[float, ...]
    interval: tuple[float, float] | None = None
    units: str = Field(min_length=1)
    statistic: str
    quote: str = Field(min_length=1)
    hardware: str | None = None
    # why the seed's number and Fathom's are not the same quantity (another definition)
    not_comparable: str | None = None
    # a count's own denominator in the seed (0 of 958 test sixes): the comparison is then of
    # rates, each side over its own total, never of counts with different denominators
    denominator: int | None = Field(default=None, gt=0)
    extract: dict[str, Any]

    @model_validator(mode="after")
    def _kind(self) -> SeedValue:
        kind = self.extract.get("kind")
        known = sorted({k for kinds in _PROTOCOLS.values() for k in kinds})
        if kind not in known:
            raise ValueError(f"extract.kind {kind!r} is not one of {known}")
        if isinstance(self.value, tuple) and kind != "none":
            raise ValueError("a list of values (one per seed) can only have extract.kind 'none'")
        return self

    @property
    def kind(self) -> str:
        return str(self.extract["kind"])

    @property
    def number(self) -> float:
        """The seed's one number, compared with Fathom's; a list of values (one per seed, kind
        ``none``) is reported, never compared, and is refused here naming it."""
        if isinstance(self.value, tuple):
            raise FathomError(
                f"seed value {self.id!r} lists {len(self.value)} values (one per seed), not one "
                "number to compare; give it one value, or leave it to the report (kind 'none')"
            )
        return self.value


class SeedData(_Strict):
    format: int
    files: dict[str, str]
    table: tuple[SeedTable, ...]
    value: tuple[SeedValue, ...]

    @model_validator(mode="after")
    def _references(self) -> SeedData:
        tables = {t.id for t in self.table}
        ids = [v.id for v in self.value]
        if len(set(ids)) != len(ids):
            raise ValueError(f"value ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
        for item in (*self.table, *self.value):
            if item.seed not in self.files:
                raise ValueError(f"{item.id}: seed {item.seed!r} is not in [files]")
        protocol = {t.id: t.protocol for t in self.table}
        for v in self.value:
            if v.table not in tables:
                raise ValueError(f"value {v.id}: table {v.table!r} is not a [[table]] id")
            if v.kind not in _PROTOCOLS[protocol[v.table]]:
                raise ValueError(
                    f"value {v.id}: extract.kind {v.kind!r} cannot be computed by a "
                    f"{protocol[v.table]} pipeline (table {v.table!r}); use one of "
                    f"{list(_PROTOCOLS[protocol[v.table]])}"
                )
        return self

    def tables_of(self, protocol: str) -> list[SeedTable]:
        """The tables whose counterparts a ``protocol`` pipeline computes."""
        return [t for t in self.table if t.protocol == protocol]

    def source(self, item: SeedTable | SeedValue) -> str:
        """``"seed 003 (003_....txt), section 'When did ...'"``."""
        return f"seed {item.seed} ({self.files[item.seed]}), section {item.section!r}"

    def values_of(self, table: str) -> list[SeedValue]:
        return [v for v in self.value if v.table == table]


def parse_seeds(text: str, origin: str = "seeds.toml") -> SeedData:
    """Validate the text of a seeds file; bad input raises :class:`FathomError` naming the key."""
    data = parse_toml(text, origin)
    try:
        return SeedData.model_validate(data)
    except ValidationError as e:
        raise FathomError(validation_message(e, origin)) from None


def load_seeds() -> SeedData:
    """The reference data shipped in ``fathom/reproduce/seeds.toml``."""
    text = (resources.files("fathom") / "reproduce" / "seeds.toml").read_text(encoding="utf-8")
    return parse_seeds(text, "fathom/reproduce/seeds.toml")
