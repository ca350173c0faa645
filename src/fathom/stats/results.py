"""The typed results model: what :mod:`fathom.stats` produces and every renderer formats.

A :class:`Comparison` carries its numbers, its rule's inputs (smallest effect of interest,
level, Holm step) and its verdict as fields; a :class:`Sentence` names the comparisons it
claims something about (:mod:`fathom.stats.claims` re-derives each claim from them); a
:class:`Table` holds :class:`Cell` values with their units. Renderers never split strings
to recover a number: they read these fields.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fathom.stats.verdicts import NOT_ESTABLISHED as NOT_ESTABLISHED
from fathom.stats.verdicts import OPPOSITE, ComparisonVerdict, DecisionVerdict


class Quantity(BaseModel):
    """What is compared: its name, unit and scale, its direction and its rule's constants.

    ``scale`` is ``"difference"`` (``d = a − b`` in ``unit``) or ``"log ratio"``
    (``d = ln a − ln b``; rendered as the ratio ``exp d``). ``higher_is_better`` ``None``
    marks a quantity without a better direction (words *higher*/*lower*).
    ``smallest_effect`` (δ) and ``resolution`` are on the scale of ``d``.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    unit: str
    scale: str = "difference"
    higher_is_better: bool | None = True
    smallest_effect: float
    resolution: float


class Comparison(BaseModel):
    """One paired comparison of arm ``a`` against arm ``b`` and its computed verdict.

    ``estimate``/``low``/``high``: the mean paired difference on the quantity's scale and
    its interval at ``level`` (the Holm-adjusted level of its step; ``None`` when n < 2 or
    no comparison). ``se`` is the t standard error ``sd/√n``, ``se_floor`` the resolution's. ``fragile``: an established verdict
    that one seed carries (its interval, recentred on a leave-one-seed-out estimate, no
    longer gives it); ``loo_held``: how many of the ``n`` recomputations on ``n − 1`` seeds
    give the same verdict.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    family: str
    quantity: Quantity
    a: str
    b: str
    verdict: ComparisonVerdict
    reason: str
    n: int = 0
    seeds: list[int] = Field(default_factory=list)
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    level: float | None = None
    nominal_level: float = 0.95
    se: float | None = None
    se_floor: float | None = None
    p_claim: float | None = None
    family_size: int = 0
    holm_step: int | None = None
    fragile: bool = False
    loo_estimates: list[float] = Field(default_factory=list)
    loo_held: int | None = None
    context: dict[str, str] = Field(default_factory=dict)
    diffs: list[float] = Field(default_factory=list)
    variances: list[float] = Field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-able form."""
        return self.model_dump(mode="json")

    def relabelled(self, cid: str, context: dict[str, str], *, mirror: bool) -> Comparison:
        """The same comparison printed under another id (``mirror``: as ``b`` against ``a``,
        every difference negated, the verdict its opposite): one verdict, never a second."""
        if not mirror:
            return self.model_copy(update={"id": cid, "context": context})

        def neg(x: float | None) -> float | None:
            return None if x is None else -x

        return self.model_copy(
            update={
                "id": cid,
                "context": context,
                "a": self.b,
                "b": self.a,
                "verdict": OPPOSITE.get(self.verdict, self.verdict),
                "estimate": neg(self.estimate),
                "low": neg(self.high),
                "high": neg(self.low),
                "diffs": [-d for d in self.diffs],
                "loo_estimates": [-x for x in self.loo_estimates],
            }
        )

    def diff_record(self) -> dict | None:
        """The paired difference renderers read (estimate, interval, n, level); ``None``
        without an estimate."""
        if self.estimate is None:
            return None
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "level": self.level,
        }

    def verdict_fields(self) -> dict:
        """The fields renderers read (verdict, reason, fragile, ``diff``), and the full model."""
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "fragile": self.fragile,
            "diff": self.diff_record(),
            "comparison": self.to_dict(),
        }


class Claim(BaseModel):
    """A sentence's claim: comparison ``comparison`` has verdict ``verdict``
    (``fragile`` when the sentence says so). ``brief``: the sentence states the verdict
    only; the numbers are in that comparison's own sentence of the same results."""

    model_config = ConfigDict(frozen=True)

    comparison: str
    verdict: ComparisonVerdict
    fragile: bool = False
    brief: bool = False


class Decision(BaseModel):
    """A verdict combined from comparisons by a stated rule (``rule``: ``"depth scaling"``,
    its ``profile``, ``per_depth`` and ``evidence``; ``"checkpoint ranking"``, its pairwise
    comparisons as ``inputs``): named so that :mod:`fathom.stats.claims` can recompute it.
    ``records``: what a rule that re-derives its verdict from the per-run numbers reads (the
    language-model depth-scaling rule of :mod:`fathom.stats.lm_scaling`: its arms, its rules
    and every run's nats/token); empty for the rules re-derived from comparisons."""

    model_config = ConfigDict(frozen=True)

    id: str
    rule: str
    verdict: DecisionVerdict
    fragile: bool = False
    profile: str = ""
    per_depth: list[str] = Field(default_factory=list)
    evidence: list[dict] = Field(default_factory=list)
    inputs: list[str] = Field(default_factory=list)
    records: dict = Field(default_factory=dict)


class Sentence(BaseModel):
    """A printed sentence and the claims it makes (checked by :mod:`fathom.stats.claims`)."""

    model_config = ConfigDict(frozen=True)

    text: str
    claims: list[Claim] = Field(default_factory=list)
    decisions: list[str] = Field(default_factory=list)


class Cell(BaseModel):
    """One table value in its display unit (accuracy already in percent, ``unit`` one of
    :data:`fathom.base.units.UNITS`): a mean (± sample SD ``sd`` over ``n`` seeds), a signed
    difference (``signed``) with its interval ``[low, high]``, a plain value, or a text
    (``text``: a name, a flag, a verdict); missing is ``value=None``. Rendered only by
    :func:`fathom.stats.numbers.fmt_cell`."""

    model_config = ConfigDict(frozen=True)

    value: float | None = None
    unit: str = ""
    sd: float | None = None
    n: int | None = None
    low: float | None = None
    high: float | None = None
    signed: bool = False
    text: str | None = None


class Table(BaseModel):
    """A titled table of cells; ``columns`` are header labels (units in the labels);
    ``id`` names it for renderers and tests (``"quality"``, ``"differences"``, ...);
    ``n_column``: the index of the column holding each row's n (a cell whose n equals it
    omits ``(n=N)``), or ``None``."""

    model_config = ConfigDict(frozen=True)

    id: str = ""
    title: str
    columns: list[str]
    rows: list[list[Cell]]
    n_column: int | None = None

    def row_n(self, row: list[Cell]) -> int | None:
        """The row's n (its ``n_column`` cell's value), or ``None``."""
        if self.n_column is None or row[self.n_column].value is None:
            return None
        return int(row[self.n_column].value)


class Results(BaseModel):
    """Everything a renderer prints: tables, comparisons, sentences and caveats."""

    model_config = ConfigDict(frozen=True)

    tables: list[Table] = Field(default_factory=list)
    comparisons: list[Comparison] = Field(default_factory=list)
    sentences: list[Sentence] = Field(default_factory=list)
    decisions: list[Decision] = Field(default_factory=list)
    caveats: list[str] = Field(default_factory=list)

    def comparison(self, cid: str) -> Comparison:
        """The comparison with id ``cid`` (KeyError naming it when absent)."""
        for c in self.comparisons:
            if c.id == cid:
                return c
        raise KeyError(f"no comparison {cid!r} in the results")
