"""exact_diagonals on a model zoo (as data) against float64 torch.func brute force.

The reference materializes every example's full logit Jacobian ``J_i [C, P]`` with
``vmap(jacrev(.))`` over the examples (the model run on one example at a time) and forms
``(1/N) sum_i diag(J_i^T H_i J_i)``, ``(1/N) sum_i g_i^2`` and ``(1/N) sum_i diag(J_i^T J_i)``
directly; nothing is shared with the code under test but the model.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

from fathom.curvature import exact_diagonals
from fathom.errors import FathomError
from model_zoo import CASES, CLASSES, make

torch.set_num_threads(1)
DT = torch.float64
RTOL = 1e-9


class PositionalEmbedding(nn.Module):
    """A custom module with a raw parameter (covered by the generic path)."""

    def __init__(self, length: int, dim: int) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.randn(length, dim) * 0.3)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.pos


class CustomTokens(nn.Module):
    """Embedding + a custom positional parameter + a Linear over positions + a raw root scale."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 4)
        self.pos = PositionalEmbedding(5, 4)
        self.proj = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.tensor(1.3))
        self.head = nn.Linear(4, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.proj(self.pos(self.embed(tokens))))
        return self.head(self.scale * h.mean(1))


LOCAL = [
    {
        "id": "custom_tokens",
        "build": CustomTokens,
        "x": lambda n, g: torch.randint(0, 11, (n, 5), generator=g),
    }
]
ZOO = CASES + LOCAL


def brute_force(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, dict]:
    """Per-example Jacobians by ``vmap(jacrev)``; the three diagonals by their definitions."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def logits_one(p: dict, xi: torch.Tensor) -> torch.Tensor:
        return functional_call(model, p, (xi[None],))[0]

    jac = vmap(jacrev(logits_one), in_dims=(None, 0))(params, x)  # name -> [N, C, *shape]
    logits = vmap(logits_one, in_dims=(None, 0))(params, x)
    prob = torch.softmax(logits, -1)
    hess = torch.diag_embed(prob) - prob[:, :, None] * prob[:, None, :]
    resid = prob - nn.functional.one_hot(y, logits.shape[1]).to(DT)
    out: dict[str, dict] = {"ggn": {}, "empirical_fisher": {}, "jacobian_gram": {}}
    for name, j in jac.items():
        jf = j.reshape(j.shape[0], j.shape[1], -1)  # [N, C, P]
        out["ggn"][name] = torch.einsum("icp,icd,idp->p", jf, hess, jf).reshape(j.shape[2:])
        out["empirical_fisher"][name] = (
            torch.einsum("icp,ic->ip", jf, resid).square().sum(0).reshape(j.shape[2:])
        )
        out["jacobian_gram"][name] = jf.square().sum((0, 1)).reshape(j.shape[2:])
        for kind in out:
            out[kind][name] = out[kind][name] / x.shape[0]
    return out


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = float(want.abs().max())
    return float((got - want).abs().max()) / scale if scale > 0 else float(got.abs().max())


@pytest.fixture(params=ZOO, ids=[c["id"] for c in ZOO])
def zoo(request) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    return make(request.param, n=5)


def test_every_diagonal_matches_brute_force(zoo) -> None:
    model, x, y = zoo
    want = brute_force(model, x, y)
    got = exact_diagonals(model, x, y)
    names = [n for n, _ in model.named_parameters()]
    assert sorted(got) == ["empirical_fisher", "ggn", "jacobian_gram"]
    bad = []
    for kind in ("ggn", "empirical_fisher", "jacobian_gram"):
        assert list(got[kind]) == names, f"{kind}: keys differ from named_parameters()"
        for name in names:
            g, w = got[kind][name], want[kind][name]
            assert g.dtype == DT and g.shape == w.shape, (kind, name, g.shape, w.shape)
            err = relative_error(g, w)
            if not err <= RTOL:
                bad.append(f"{kind}/{name}: rel err {err:.3g}")
        nonzero = sum(float(want[kind][p].abs().max()) > 0 for p in names)
        assert nonzero >= len(names) // 2, f"{kind}: the reference is trivial on this case"
    assert not bad, "\n".join(bad)


def test_user_model_is_left_untouched(zoo) -> None:
    model, x, y = zoo
    model = model.float().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    exact_diagonals(model, x.float() if x.is_floating_point() else x, y)
    assert model.training
    for k, v in model.state_dict().items():
        assert v.dtype == before[k].dtype and torch.equal(v, before[k]), k
    assert all(p.grad is None for p in model.parameters())


# -- bad input ------------------------------------------------------------------------------


class NoParams(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class ArgmaxOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).argmax(1, keepdim=True)


class OldStyleSquare(torch.autograd.Function):
    """A custom autograd.Function without setup_context: torch.func cannot transform it."""

    @staticmethod
    def forward(ctx, w):
        ctx.save_for_backward(w)
        return w * w

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        return 2 * w * g


class Opaque(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * OldStyleSquare.apply(self.w)


def _xy(n: int = 4, d: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(9)
    return torch.randn(n, d, generator=g, dtype=DT), torch.randint(0, 3, (n,), generator=g)


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (NoParams(), "no parameters"),
        (nn.Sequential(nn.Linear(4, 3), nn.Flatten(0)), r"logits shaped \[N, classes\]"),
        (nn.Sequential(nn.Linear(4, 6), nn.Unflatten(1, (2, 3))), r"logits shaped \[N, classes\]"),
        (ArgmaxOut(), "floating-point logits"),
        (nn.Sequential(Opaque(), nn.Linear(4, 3)), r"module '0' \(Opaque\)"),
    ],
    ids=["no_parameters", "flat_output", "3d_output", "integer_output", "not_differentiable"],
)
def test_bad_models_are_refused_naming_the_problem(model: nn.Module, match: str) -> None:
    x, y = _xy()
    with pytest.raises(FathomError, match=match):
        exact_diagonals(model, x, y)


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        (torch.tensor([0, 1, 2]), r"shape \[4\]"),
        (torch.tensor([0.0, 1.0, 2.0, 0.0]), "integer tensor"),
        (torch.tensor([0, 1, 2, 3]), r"in \[0, 3\)"),
    ],
)
def test_bad_labels_are_refused(labels: torch.Tensor, match: str) -> None:
    x, _ = _xy()
    with pytest.raises(FathomError, match=match):
        exact_diagonals(nn.Linear(4, 3), x, labels)


def test_batchnorm_in_train_mode_is_evaluated_on_running_statistics() -> None:
    model, x, y = make(CASES[1], n=4)
    want = exact_diagonals(model, x, y)
    model.train()
    got = exact_diagonals(model, x, y)
    assert model.training
    for kind in want:
        for name in want[kind]:
            torch.testing.assert_close(got[kind][name], want[kind][name], rtol=0, atol=0)


def test_readme_curvature_snippet_runs(capsys: pytest.CaptureFixture) -> None:
    import re
    from pathlib import Path

    import fathom

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text[text.index("- **Exact curvature of your own model.**") :]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None
    code = "\n".join(line.strip() for line in block.group(1).splitlines())
    model, x, y = make(CASES[1], n=6)
    namespace = {"fathom": fathom, "model": model.float(), "x": x.float(), "y": y}
    exec(compile(code, "README.md", "exec"), namespace)
    assert set(namespace["diags"]["ggn"]) == {n for n, _ in model.named_parameters()}
    assert "0.weight" in capsys.readouterr().out
