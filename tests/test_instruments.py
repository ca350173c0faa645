"""``fathom.Instruments`` on the model zoo against float64 torch.func brute force."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn

import fathom
from fathom.errors import FathomError
from fathom.telemetry.registry import field_for
from model_zoo import CASES, IDS, brute_force_grads, make
from test_telemetry import allclose_report, brute_moments

MOMENTS = ("mean_sq_norm", "diversity", "max_share", "participation", "cos_cyclic_mean")
MOMENTS += ("noise_scale", "cov_along_mean")


def _weights(layer_params, want, n) -> torch.Tensor:
    return torch.cat([want[q].reshape(n, -1) for q in layer_params], dim=1)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_moment_matches_brute_force(case) -> None:
    model, x, y = make(case, n=9)
    ins = fathom.Instruments(model, x, y, families=("gradients", "moments", "backprop"))
    row = ins.observe()
    want = brute_force_grads(model, x, y)
    bad = []
    for layer in ins.layers:
        qual = dict(zip(layer.params, layer.qualified, strict=True))
        weights = [qual[p] for p in layer.weights]
        ref = brute_moments(_weights(weights, want, len(y)).detach())
        got = {k: row[f"grad/pex/{k}/{layer.name}"] for k in MOMENTS}
        got["mean_norm"] = row[f"grad/mean/weight_norm/{layer.name}"]
        norms = _weights(weights, want, len(y)).detach().norm(dim=1)
        for key, q in (("q10", 0.1), ("q50", 0.5), ("q90", 0.9)):
            ref[f"norm_{key}"] = float(torch.quantile(norms, q))
            got[f"norm_{key}"] = row[f"grad/pex/norm_{key}/{layer.name}"]
        ref["norm_max"], got["norm_max"] = (
            float(norms.max()),
            row[f"grad/pex/norm_max/{layer.name}"],
        )
        if layer.biases:
            biases = [qual[b] for b in layer.biases]
            ref["bias"] = float(_weights(biases, want, len(y)).detach().mean(0).norm())
            got["bias"] = row[f"grad/mean/bias_norm/{layer.name}"]
        else:
            assert row[f"grad/mean/bias_norm/{layer.name}"] is None
        bad += [f"{layer.name} {b}" for b in allclose_report(got, ref, rtol=1e-9, atol=1e-13)]
    assert not bad, "\n".join(bad)
    assert all(field_for(k) for k in row)


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "opt": copy.deepcopy(opt.state_dict()),
        "flags": [m.training for m in model.modules()],
        "gains": [(getattr(m, "gain", None), getattr(m, "mask", None)) for m in model.modules()],
        "rng": torch.get_rng_state(),
    }


def _equal(a: dict, b: dict) -> list[str]:
    bad = [k for k in ("flags", "gains") if a[k] != b[k]]
    bad += [k for k in a["state"] if not torch.equal(a["state"][k], b["state"][k])]
    bad += [
        f"grad {i}"
        for i, (u, v) in enumerate(zip(a["grads"], b["grads"], strict=True))
        if (u is None) != (v is None) or (u is not None and not torch.equal(u, v))
    ]
    if not torch.equal(a["rng"], b["rng"]):
        bad.append("rng")
    if repr(a["opt"]) != repr(b["opt"]):
        bad.append("optimizer")
    return bad


@pytest.mark.parametrize("cid", ["residual_cnn", "staged_lif", "transformer"])
def test_observe_leaves_state_as_found(cid) -> None:
    model, x, y = make(CASES[IDS.index(cid)], n=6)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.train()  # BatchNorm in train mode: instruments switch to running statistics
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    for m in model.modules():
        if hasattr(m, "mask"):
            m.mask = False  # a deleted branch: observe runs dense and restores the mask
    before = _state(model, opt)
    row = fathom.Instruments(model, x, y, families="all").observe(optimizer=opt)
    assert _equal(before, _state(model, opt)) == []
    assert row["probe/ce"] is not None
    assert any(k.startswith("param/momentum_norm/") and v is not None for k, v in row.items())


def test_field_names_and_params_family_for_a_residual_cnn() -> None:
    model, x, y = make(CASES[IDS.index("residual_cnn")], n=5)
    ins = fathom.Instruments(model, x, y)
    row = ins.observe()
    assert list(row) == ins.field_names()
    assert "grad/pex/diversity/blocks.0.branch.0" in row
    assert "probe/act/mean/stem" not in row and "probe/act/mean/blocks.0.branch.0" in row
    assert row["param/bias_norm/blocks.0.branch.0"] is None  # conv without bias
    w = model.blocks[0].branch[1].weight
    assert row["param/weight_norm/blocks.0.branch.1"] == pytest.approx(float(w.norm()), rel=1e-12)
    assert row["param/disp_total"] == 0.0
    assert row["param/momentum_norm/stem"] is None  # no optimizer given


def test_import_is_lazy_and_top_level() -> None:
    code = (
        "import sys, fathom; assert 'torch' not in sys.modules, 'import fathom loads torch'; "
        "fathom.Instruments; assert 'fathom.seam' in sys.modules; "
        # torch.compiler.disable would import torch._dynamo (1.2 s): made at the first trace
        "import fathom.depth; assert 'torch._dynamo' not in sys.modules, 'fathom.depth loads dynamo'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class Flat(nn.Module):
    def __init__(self, out: nn.Module) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.out = out

    def forward(self, x):
        return self.out(self.lin(x))


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (nn.Sequential(nn.ReLU()), "has no parameters"),
        (Flat(nn.Flatten(0)), r"logits shaped \[N, classes\]"),
        (Flat(nn.Unflatten(1, (3, 1))), r"logits shaped \[N, classes\]"),
    ],
)
def test_bad_models_refused(model, match) -> None:
    with pytest.raises(FathomError, match=match):
        fathom.Instruments(model, torch.randn(5, 4), torch.zeros(5, dtype=torch.long)).observe()


@pytest.mark.parametrize("where", ["root", "submodule"])
def test_a_compiled_model_is_refused_with_the_true_reason(where) -> None:
    """Once refused as "modified in place" (the compiled forward's outputs); now: compiled,
    pass ``._orig_mod`` (which then works)."""
    from fathom.curvature import exact_diagonals

    torch.manual_seed(0)
    model = Flat(nn.Tanh())
    x, y = torch.randn(5, 4), torch.zeros(5, dtype=torch.long)
    if where == "root":
        compiled, path = torch.compile(model, backend="eager"), r"model\._orig_mod"
    else:
        compiled, path = (
            nn.Sequential(torch.compile(model, backend="eager")),
            r"model\.0\._orig_mod",
        )
    with pytest.raises(FathomError, match=rf"compiled by torch\.compile.*{path}"):
        fathom.Instruments(compiled, x, y).observe()
    with pytest.raises(FathomError, match=rf"compiled by torch\.compile.*{path}"):
        exact_diagonals(compiled, x, y)
    assert fathom.Instruments(model, x, y).observe()["probe/ce"] is not None


def test_observe_restores_buffers_a_forward_updates_in_place() -> None:
    """Once a call counter went 0 -> 5 across one ``observe()``."""
    from test_audit_costs import Counter

    torch.manual_seed(0)
    model = Flat(Counter())
    row = fathom.Instruments(model, torch.randn(5, 4), torch.zeros(5, dtype=torch.long)).observe()
    assert row["probe/ce"] is not None and int(model.out.calls) == 0


def test_bad_probes_refused() -> None:
    model = Flat(nn.Identity())
    x = torch.randn(5, 4)
    with pytest.raises(FathomError, match="one label per example"):
        fathom.Instruments(model, x, torch.zeros(4, dtype=torch.long))
    with pytest.raises(FathomError, match="integer class labels"):
        fathom.Instruments(model, x, torch.zeros(5))
    with pytest.raises(FathomError, match=r"labels outside 0 \.\. 2"):
        fathom.Instruments(model, x, torch.full((5,), 3)).observe()
    with pytest.raises(FathomError, match="whole data splits"):
        fathom.Instruments(model, x, torch.zeros(5, dtype=torch.long), families=("scores",))


def test_readme_instruments_snippet_runs(capsys) -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text[text.index("- **Instruments on your own model.**") :]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "README Instruments section lost its python snippet"
    lines = block.group(1).splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    namespace: dict = {}
    exec(compile("\n".join(line[indent:] for line in lines), "README.md", "exec"), namespace)
    row, ins = namespace["row"], namespace["ins"]
    assert row["grad/pex/norm_q50/3.branch.0"] > 0 and row["param/momentum_norm/6"] is not None
    out = capsys.readouterr().out
    assert "3.branch.1.weight" in out and "fast batchnorm" in out
    assert [la.name for la in ins.layers] == ["0", "1", "3.branch.0", "3.branch.1", "6"]
