"""One layer alignment across recipes (position in the model), in tables and in the curves."""

from __future__ import annotations

from pathlib import Path

from fathom.report import load_runs
from fathom.report.html import explorer_payload
from fathom.report.layers import align_layers
from fathom.report.runs import RunData
from synthetic_runs import synthetic_history, telemetry_names, write_run

RES = ["stem", "blocks.0.res.branch", "blocks.1.res.branch", "head"]
PLAIN = ["stem", "blocks.0.res", "blocks.1.res", "head"]


def _run(run_id: str, layers: list[str] | None) -> RunData:
    telemetry = {"layers": [{"name": n} for n in layers]} if layers else {}
    return RunData(Path(run_id), run_id, {"telemetry": telemetry}, [])


def test_positions_align_and_unlisted_runs_match_by_name() -> None:
    runs = [_run("res", RES), _run("plain", PLAIN), _run("old", None)]
    a = align_layers(runs, {"old": ["stem", "blocks.0.res", "extra"]})
    assert a.labels == [
        "stem",
        "blocks.0.res.branch / blocks.0.res",
        "blocks.1.res.branch / blocks.1.res",
        "head",
        "extra",
    ]
    assert a.label("plain", "blocks.1.res") == a.label("res", "blocks.1.res.branch")
    assert a.names["blocks.0.res.branch / blocks.0.res"]["plain"] == "blocks.0.res"
    assert a.names["blocks.0.res.branch / blocks.0.res"]["res"] == "blocks.0.res.branch"
    # a run without a manifest layer list joins the position holding the same name
    assert a.label("old", "blocks.0.res") == "blocks.0.res.branch / blocks.0.res"
    assert a.label("old", "extra") == "extra" and "res" not in a.names.get("extra", {})
    assert a.last() == "extra"
    # label order follows the run order given (reference recipe first)
    b = align_layers([_run("plain", PLAIN), _run("res", RES)])
    assert b.labels[1] == "blocks.0.res / blocks.0.res.branch"


def test_models_of_different_depth_are_matched_by_name_only() -> None:
    deep = ["stem", "blocks.0.res.branch", "blocks.1.res.branch", "blocks.2.res.branch", "head"]
    a = align_layers([_run("res", RES), _run("deep", deep), _run("plain", PLAIN)])
    assert a.label("deep", "head") == a.label("res", "head") == "head"
    assert a.label("plain", "blocks.0.res") == "blocks.0.res"  # no position claim
    assert a.labels == [*RES[:3], "head", "blocks.2.res.branch", "blocks.0.res", "blocks.1.res"]


def test_curves_put_the_same_layer_of_every_recipe_in_one_panel(tmp_path: Path) -> None:
    pattern = ("grad/pex/diversity/{layer}", "probe/act/zero_frac/{input}")
    for recipe, names in (("residual", RES), ("plain", PLAIN)):
        tel = telemetry_names(4, pattern)
        rename = dict(zip(RES, names))
        tel = [t.rsplit("/", 1)[0] + "/" + rename[t.rsplit("/", 1)[1]] for t in tel]
        write_run(
            tmp_path / "s" / f"{recipe}-s1",
            study="s",
            recipe=recipe,
            seed=1,
            lr=0.1,
            rows=synthetic_history(1, [0, 1], layers=4, telemetry=tel),
            layers=names,
        )
    runs = sorted(load_runs(tmp_path / "s"), key=lambda r: r.recipe != "residual")
    data = explorer_payload(runs)
    facets = data["meta"]["grad/pex/diversity/{layer}"]["facets"]
    assert facets == [
        "stem",
        "blocks.0.res.branch / blocks.0.res",
        "blocks.1.res.branch / blocks.1.res",
        "head",
    ]
    assert data["meta"]["probe/act/zero_frac/{layer}"]["facets"] == facets[1:]
    by_id = {r["id"]: r for r in data["runs"]}
    # every (run, panel) resolves to a field that run records, under its own layer name
    for run in data["runs"]:
        for label in facets:
            own = run["layers"].get(label, label)
            assert f"grad/pex/diversity/{own}" in data["names"]
            assert run["cols"][data["names"].index(f"grad/pex/diversity/{own}")] is not None
    assert by_id["plain-s1"]["layers"]["blocks.1.res.branch / blocks.1.res"] == "blocks.1.res"
    assert by_id["residual-s1"]["layers"]["blocks.1.res.branch / blocks.1.res"] == (
        "blocks.1.res.branch"
    )
    assert "head" not in by_id["plain-s1"]["layers"]  # same name: no mapping needed
