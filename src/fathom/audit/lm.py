"""One language-model checkpoint audited: per-mask nats/token and perplexity, FLOPs, the
greedy removal path, interactions, and the computed sentences on which blocks can go.

The numbers are defined in :mod:`fathom.audit.tokens`. The verdicts are the statistics
module's (:func:`fathom.stats.judge`) on the *test* split, paired over its contiguous
chunks (in place of seeds), smallest effect ``rules.ce_nats`` in nats per token:

* **single removals**, one Holm family of ``L``: block ``l`` *can go* when the damage of
  removing it alone is ``equivalent`` (interval inside ``±δ``), *cannot go* when ``worse``;
* **the greedy path**, its own Holm family of ``L`` steps: the most blocks that can go
  together is the longest prefix of the path (chosen on validation) whose every step is
  ``equivalent`` on test.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np
import torch
from torch import nn

from fathom.audit.costs import mask_costs
from fathom.audit.masks import mask_label, removable_branch_count
from fathom.audit.tokens import (
    SPLITS,
    MaskEvaluator,
    lattice_interactions,
    pair_interactions,
    plan_and_evaluate,
    planned_masks,
)
from fathom.depth import dense_eval, state_kept
from fathom.errors import FathomError
from fathom.stats import judge, paired
from fathom.stats.audit_sentences import path_sentence, removal_words, single_sentences
from fathom.stats.quantities import cross_entropy
from fathom.stats.results import Comparison
from fathom.stats.rules import DEFAULT_RULES, Rules


def _paired_damage(ev: MaskEvaluator, label: str, full: str, cid: str, scope: str):
    s = ev.scores["test"]
    a, b = s.chunk_ce(label), s.chunk_ce(full)
    q = cross_entropy("test nats per token")
    return paired(
        cid,
        q,
        dict(enumerate(a.tolist())),
        dict(enumerate(b.tolist())),
        names=(f"without {scope}", "full network"),
        context={"scope": scope, "unit": "chunks"},
    )


def _mask_rows(
    labels: list[str], ce: dict[str, dict[str, float]], flops: dict[str, int], t: int, full: str
) -> list[dict[str, Any]]:
    """Per mask: kept blocks, FLOPs per token and of the full network, and per split
    ``ce`` (nats/token), ``ppl = exp(ce)`` and ``damage = ce − ce_full``."""
    return [
        {
            "mask": lab,
            "kept": lab.count("1"),
            "flops_per_token": flops[lab] / t,
            "flops_fraction": flops[lab] / flops[full],
        }
        | {
            n: {
                "ce": ce[n][lab],
                "ppl": float(np.exp(ce[n][lab])),
                "damage": ce[n][lab] - ce[n][full],
            }
            for n in SPLITS
        }
        for lab in labels
    ]


def _judge_removals(
    ev: MaskEvaluator, layers: int, path: list[dict[str, Any]], full: str, rules: Rules
) -> tuple[list[str], list[Comparison], list[Comparison]]:
    """The single removals (one Holm family) and the greedy path's steps (another), judged
    on test damage paired over chunks (module docstring)."""
    single_labels = [
        mask_label(tuple(0 if j == b else 1 for j in range(layers))) for b in range(layers)
    ]
    singles = judge(
        "single-block removal",
        [
            _paired_damage(ev, lab, full, f"block {b}", f"block {b}")
            for b, lab in enumerate(single_labels)
        ],
        rules,
    )
    singles = [
        c.model_copy(update={"context": {**c.context, "mask": lab}})
        for c, lab in zip(singles, single_labels)
    ]
    steps = judge(
        "greedy removal path",
        [
            _paired_damage(
                ev, p["mask"], full, f"greedy step {p['step']}",
                f"blocks {[q['removed'] for q in path[: p['step']]]}",
            )
            for p in path
        ],
        rules,
    )  # fmt: skip
    return single_labels, singles, steps


def lm_audit_checkpoint(
    model: nn.Module,
    splits: Any,
    max_masks: int,
    batch_size: int = 256,
    on_mask: Callable[[int, int], None] | None = None,
    rules: Rules = DEFAULT_RULES,
) -> dict[str, Any]:
    """Every table of :mod:`fathom.audit.tokens` for ``model`` on ``splits.val_*``/``test_*``
    (windows ``[W, T]`` and next-token targets ``[W, T]``), and the sentences."""
    layers = removable_branch_count(model)
    data = {n: (getattr(splits, f"{n}_x"), getattr(splits, f"{n}_y")) for n in SPLITS}
    for name, (x, y) in data.items():
        if x.dim() != 2 or y.shape != x.shape:
            raise FathomError(
                f"the {name} split holds inputs {list(x.shape)} and targets {list(y.shape)}; a "
                "language model's audit needs token windows [W, T] with next-token targets [W, T]"
            )
    passes = [0]
    total = planned_masks(layers, max_masks)

    def tick() -> None:
        passes[0] += 1
        if on_mask is not None:
            on_mask(passes[0], total)

    full = mask_label((1,) * layers)
    with ExitStack() as stack:
        for cm in (dense_eval(model), state_kept(model, parameters=True), torch.no_grad()):
            stack.enter_context(cm)
        ev = MaskEvaluator(model, data, batch_size, on_mask=tick)
        plan = plan_and_evaluate(ev, layers, max_masks)
    labels = ev.order
    rows = np.array([[int(c) for c in lab] for lab in labels], dtype=np.uint8)
    window = data["val"][0][:1]
    flops = dict(zip(labels, (int(f) for f in mask_costs(model, window, rows))))
    t = int(window.shape[1])
    ce = {n: {lab: ev.scores[n].ce(lab) for lab in labels} for n in SPLITS}
    masks = _mask_rows(labels, ce, flops, t, full)
    path = plan["greedy"]
    single_labels, singles, steps = _judge_removals(ev, layers, path, full, rules)
    damage_test = {lab: ce["test"][lab] - ce["test"][full] for lab in labels}
    record: dict[str, Any] = {
        "k": layers,
        "context": t,
        "tokens": {n: int(ev.scores[n].tokens.sum()) for n in SPLITS},
        "chunks": {n: len(ev.bounds[n]) - 1 for n in SPLITS},
        "full_mask": full,
        "coverage": plan["coverage"],
        "masks": masks,
        "singles": [
            {
                "block": b,
                "mask": lab,
                "verdict": c.verdict_fields(),
                "words": removal_words(c.verdict),
            }
            for b, (c, lab) in enumerate(zip(singles, single_labels))
        ],
        "greedy": [
            p | {"test_damage": damage_test[p["mask"]], "verdict": c.verdict_fields()}
            for p, c in zip(path, steps)
        ],
        "interactions": {
            "pairs_around_full": pair_interactions(damage_test, layers),
            "lattice": lattice_interactions(ce["test"], layers)
            if plan["coverage"]["enumerated"]
            else None,
            "split": "test",
            "unit": "nats per token",
        },
        "smallest_effect_nats": rules.ce_nats,
    }
    record["sentences"] = [
        *single_sentences(singles, flops, full, rules.ce_nats),
        path_sentence(path, steps, flops, full),
    ]
    return record
