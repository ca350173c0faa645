"""exact_diagonals with a loss argument: every loss, output layout and input structure is
exact against a float64 brute force built from torch alone (``jacrev`` of the whole output,
``torch.autograd.functional.hessian`` of the reduced loss), or refused by name.

The brute force states each family from its definition
(:mod:`fathom.curvature.families`): ``GGN = J^T (d^2 L / dz^2) J`` over the whole batch
(the loss Hessian is block diagonal over examples), ``EF = c sum_i g_i g_i^T`` with
``g_i = J_i^T dL_i/dz_i`` and ``L = c sum_i L_i``, ``Gram = c sum_i J_i^T J_i``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev

import fathom.curvature.exact as exact
from fathom.curvature import exact_diagonals
from fathom.errors import FathomError
from fathom.losses import make_loss

torch.set_num_threads(1)


def brute_force(model, x, y, loss, output=None) -> dict:
    """Every family from its definition (module docstring), float64."""
    m = copy.deepcopy(model).double().eval()
    params = {k: v.detach() for k, v in m.named_parameters()}
    x64 = _map(x, lambda t: t.double() if t.is_floating_point() else t)

    def out(p):
        if isinstance(x64, dict):
            o = functional_call(m, p, (), x64)
        elif isinstance(x64, tuple):
            o = functional_call(m, p, x64)
        else:
            o = functional_call(m, p, (x64,))
        return o if output is None else o[output]

    z = out(params).detach()
    n, e = z.shape[0], z[0].numel()
    terms = loss.terms(z, y)
    h = torch.autograd.functional.hessian(terms.value, z).reshape(n * e, n * e)
    g = terms.residual(z).reshape(n, e)
    c = float(terms.scale)
    jac = jacrev(out)(params)
    res: dict = {"ggn": {}, "empirical_fisher": {}, "jacobian_gram": {}}
    for k, j in jac.items():
        jf = j.reshape(n * e, -1)
        res["ggn"][k] = torch.einsum("ap,ab,bp->p", jf, h, jf).reshape(params[k].shape)
        je = j.reshape(n, e, -1)
        gi = torch.einsum("ne,nep->np", g, je) / c
        res["empirical_fisher"][k] = (c * gi.square().sum(0)).reshape(params[k].shape)
        res["jacobian_gram"][k] = (c * je.square().sum((0, 1))).reshape(params[k].shape)
    return res


def _map(x, fn):
    if isinstance(x, dict):
        return {k: fn(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(fn(v) for v in x)
    return fn(x)


def assert_exact(got, want, rtol: float = 1e-10) -> None:
    bad = []
    for fam in got:
        for k, w in want[fam].items():
            err = float((got[fam][k] - w).abs().max() / w.abs().max().clamp_min(1e-300))
            if err > rtol and float(w.abs().max()) > 1e-300:
                bad.append(f"{fam}/{k}: {err:.3g}")
    assert not bad, "\n".join(bad)


class Tokens(nn.Module):
    """``[N, T, D] -> [N, T, V]``: a per-token MLP with attention mixing the tokens."""

    def __init__(self, d: int = 4, v: int = 5) -> None:
        super().__init__()
        self.inp = nn.Linear(d, 8)
        self.att = nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, v)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = self.norm(h + self.att(h, h, h, need_weights=False)[0])
        return self.head(h)


class Segment(nn.Module):
    """``[N, 2, H, W] -> [N, C, H, W]`` (PyTorch's layout, classes at dim 1)."""

    def __init__(self, c: int = 3) -> None:
        super().__init__()
        self.a = nn.Conv2d(2, 4, 3, padding=1)
        self.b = nn.Conv2d(4, c, 1)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class DictModel(nn.Module):
    """HF style: ``model(**batch)`` returns a dict with ``logits``."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 6)
        self.lin = nn.Linear(6, 4)

    def forward(self, input_ids, scale):
        h = self.emb(input_ids) * scale[:, None, None]
        return {"logits": self.lin(torch.tanh(h)), "hidden": h}


class TupleModel(nn.Module):
    """``model(a, b)`` returning ``(aux, logits)``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 5)
        self.b = nn.Linear(2, 5)
        self.out = nn.Linear(5, 3)

    def forward(self, a, b):
        h = torch.tanh(self.a(a) + self.b(b))
        return h, self.out(h)


def _seq(n=3, t=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, t, 4, generator=g)
    y = torch.randint(0, 5, (n, t), generator=g)
    y[0, 1] = -100
    return x, y


def test_sequence_cross_entropy_with_ignored_tokens_is_exact() -> None:
    torch.manual_seed(0)
    model, (x, y) = Tokens(), _seq()
    for loss in (
        make_loss("cross_entropy", class_dim=-1),
        make_loss("cross_entropy", class_dim=-1, reduction="sum", label_smoothing=0.1),
    ):
        got = exact_diagonals(model, x, y, loss=loss)
        assert_exact(got, brute_force(model, x, y, loss))


def test_class_dim_argument_equals_a_loss_carrying_it() -> None:
    torch.manual_seed(1)
    model, (x, y) = Tokens(), _seq()
    a = exact_diagonals(model, x, y, class_dim=-1)
    b = exact_diagonals(model, x, y, loss=make_loss("cross_entropy", class_dim=-1))
    for fam in a:
        for k in a[fam]:
            torch.testing.assert_close(a[fam][k], b[fam][k], rtol=0, atol=0)


def test_per_pixel_cross_entropy_and_probability_targets_are_exact() -> None:
    torch.manual_seed(2)
    model = Segment()
    x = torch.randn(2, 2, 3, 3)
    y = torch.randint(0, 3, (2, 3, 3))
    loss = make_loss("cross_entropy", class_dim=1)
    assert_exact(exact_diagonals(model, x, y, loss=loss), brute_force(model, x, y, loss))
    p = torch.rand(2, 3, 3, 3, dtype=torch.float64)
    p = p / p.sum(1, keepdim=True)
    assert_exact(exact_diagonals(model, x, p, loss=loss), brute_force(model, x, p, loss))


@pytest.mark.parametrize("name", ["mse", "bce_with_logits"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_elementwise_losses_are_exact_on_any_output_shape(name, reduction) -> None:
    torch.manual_seed(3)
    loss = make_loss(name, reduction=reduction)
    mlp = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    x = torch.randn(5, 4)
    y = torch.rand(5, 3)
    assert_exact(exact_diagonals(mlp, x, y, loss=loss), brute_force(mlp, x, y, loss))
    seg, xs = Segment(2), torch.randn(2, 2, 3, 3)
    ys = torch.rand(2, 2, 3, 3)
    assert_exact(exact_diagonals(seg, xs, ys, loss=loss), brute_force(seg, xs, ys, loss))


def test_a_regression_output_of_one_value_per_example_is_exact_with_mse() -> None:
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1), nn.Flatten(0))
    x, y = torch.randn(6, 3), torch.randn(6)
    loss = make_loss("mse")
    assert_exact(exact_diagonals(model, x, y, loss=loss), brute_force(model, x, y, loss))


def test_dict_inputs_and_a_dict_output_are_exact() -> None:
    torch.manual_seed(5)
    model = DictModel()
    batch = {"input_ids": torch.randint(0, 7, (3, 4)), "scale": torch.rand(3) + 0.5}
    y = torch.randint(0, 4, (3, 4))
    loss = make_loss("cross_entropy", class_dim=-1)
    got = exact_diagonals(model, batch, y, loss=loss, output="logits")
    assert_exact(got, brute_force(model, batch, y, loss, output="logits"))
    with pytest.raises(FathomError, match="output='<key>'"):
        exact_diagonals(model, batch, y, loss=loss)


def test_tuple_inputs_and_a_tuple_output_are_exact() -> None:
    torch.manual_seed(6)
    model = TupleModel()
    x = (torch.randn(4, 3), torch.randn(4, 2))
    y = torch.tensor([0, 2, 1, 1])
    got = exact_diagonals(model, x, y, output=1)
    assert_exact(got, brute_force(model, x, y, make_loss(), output=1))
    with pytest.raises(FathomError, match="different numbers of examples"):
        exact_diagonals(model, (torch.randn(4, 3), torch.randn(3, 2)), y, output=1)


@pytest.mark.parametrize("chunk", [None, 1, 2])
def test_groups_of_output_directions_change_nothing(chunk, monkeypatch) -> None:
    """A budget smaller than one example's directions: chunked over directions as well."""
    torch.manual_seed(7)
    model, (x, y) = Tokens(), _seq(n=3, t=5)
    loss = make_loss("cross_entropy", class_dim=-1)
    want = exact_diagonals(model, x, y, loss=loss)
    monkeypatch.setattr(exact, "_ELEMENTS", 300)
    sizes: list[int] = []
    real = exact.groups

    def counted(*args):
        for group in real(*args):
            sizes.append(group.directions.shape[0])
            yield group

    monkeypatch.setattr(exact, "groups", counted)
    got = exact_diagonals(model, x, y, loss=loss, chunk_size=chunk)
    assert_exact(got, want, 1e-12)
    per_example = 5 * 4 + 1 + 5 * 5  # GGN (T (V - 1)), Fisher, Gram (T V)
    chunks = -(-3 // (chunk or 1))  # the tiny budget takes one example per chunk by default
    assert sum(sizes) == per_example * chunks and max(sizes) < per_example


def test_misread_layouts_and_targets_are_refused_by_name() -> None:
    model, (x, y) = Tokens(), _seq()
    with pytest.raises(FathomError, match="class_dim=-1"):
        exact_diagonals(model, x, y)
    with pytest.raises(FathomError, match=r"shape \[3, 4\]"):
        exact_diagonals(model, x, y[:, :2], class_dim=-1)
    with pytest.raises(FathomError, match="every position"):
        exact_diagonals(model, x, torch.full_like(y, -100), class_dim=-1)
    with pytest.raises(FathomError, match="did you mean 'mse'"):
        exact_diagonals(model, x, y, loss="mse_loss")
    with pytest.raises(FathomError, match=r"\[N, 1\].*zero"):
        exact_diagonals(nn.Linear(3, 1), torch.randn(4, 3), torch.zeros(4, dtype=torch.long))


def _per_example_sq_norms(model, x, y, loss, weight_of) -> torch.Tensor:
    """``||d L_i / d W||^2`` per example by a loop, ``L_i = (1/c) sum_p w_ip l_ip``, float64."""
    m = copy.deepcopy(model).double().eval()
    z = m(x.double())
    terms = loss.terms(z, y)
    c = float(terms.scale)
    per = terms.losses(z) * terms.weights(z) / c  # [N, P]
    w = weight_of(m)
    return torch.stack(
        [
            torch.autograd.grad(per[i].sum(), w, retain_graph=True)[0].square().sum()
            for i in range(len(per))
        ]
    )


@pytest.mark.parametrize(
    "loss", [make_loss("cross_entropy", class_dim=-1), make_loss("mse", reduction="sum")]
)
def test_instruments_take_a_loss_and_a_sequence_output(loss) -> None:
    """Per-example gradient moments on ``[N, T, V]`` (one example = the whole sequence):
    ``grad/pex/mean_sq_norm`` of the head is ``(1/N) sum_i ||grad L_i||^2`` by a loop."""
    import fathom

    torch.manual_seed(8)
    model, (x, y) = Tokens(), _seq(n=4, t=3)
    if loss.name == "mse":
        y = torch.randn(4, 3, 5)
    row = fathom.Instruments(model.double(), x.double(), y, loss=loss).observe()
    want = _per_example_sq_norms(model, x, y, loss, lambda m: m.head.weight).mean()
    got = row["grad/pex/mean_sq_norm/head"]
    assert abs(got - float(want)) <= 1e-9 * float(want)
    assert row["probe/ce"] is None  # defined over [N, C] integer labels only


def test_instruments_refuse_a_sequence_output_without_its_layout() -> None:
    import fathom

    model, (x, y) = Tokens(), _seq()
    with pytest.raises(FathomError, match="class_dim=-1"):
        fathom.Instruments(model, x, y).observe()


def test_curvature_docs_are_generated_from_the_tables() -> None:
    """docs/curvature.md is current, and every family and loss has its definition there."""
    from pathlib import Path

    from fathom.curvature.docs import is_current, render
    from fathom.curvature.families import FAMILIES
    from fathom.losses import LOSS_DEFINITIONS, LOSSES

    path = Path(__file__).resolve().parents[1] / "docs" / "curvature.md"
    assert is_current(path), "docs/curvature.md is stale: run `python -m fathom.curvature.docs`"
    text = render()
    assert set(LOSS_DEFINITIONS) == set(LOSSES)
    for f in FAMILIES.values():
        assert f"| `{f.name}` | {f.definition} |" in text
    for name, definition in LOSS_DEFINITIONS.items():
        assert f"`{name}`" in text and definition in text


def test_instruments_read_dict_inputs_and_a_dict_output() -> None:
    """The probe as a dict (``model(**x)``) and the output by key: per-example moments of the
    head equal a loop over examples, and the probe's CE is the plain [N, C] one."""
    import fathom

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.head = nn.Linear(3, 4), nn.Linear(4, 3)

        def forward(self, features, gain):
            return {"logits": self.head(torch.tanh(self.a(features))) * gain[:, None]}

    torch.manual_seed(9)
    model = Head().double()
    x = {"features": torch.randn(5, 3, dtype=torch.float64), "gain": torch.rand(5).double() + 1}
    y = torch.tensor([0, 1, 2, 1, 0])
    row = fathom.Instruments(model, x, y, output="logits").observe()
    z = model(**x)["logits"]
    assert abs(row["probe/ce"] - float(torch.nn.functional.cross_entropy(z, y))) < 1e-12
    per = [
        torch.autograd.grad(
            torch.nn.functional.cross_entropy(z[i : i + 1], y[i : i + 1]),
            model.head.weight,
            retain_graph=True,
        )[0]
        .square()
        .sum()
        for i in range(5)
    ]
    want = float(torch.stack(per).mean())
    assert abs(row["grad/pex/mean_sq_norm/head"] - want) <= 1e-10 * want


def test_the_seam_discovers_through_tuple_inputs_and_a_selected_output() -> None:
    from fathom.seam import discover

    model = TupleModel().double()
    x = (torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64))
    seam = discover(model, x, output=1)
    assert {la.name for la in seam.layers} == {"a", "b", "out"}
    assert seam.forward(x).shape == (4, 3)
    with pytest.raises(FathomError, match="output=<index>"):
        discover(model, x)


class TinyLM(nn.Module):
    """HF style: ``model(input_ids=..., attention_mask=...)`` returns ``{"logits": [N, T, V]}``."""

    def __init__(self, vocab: int = 80, d: int = 6) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(3, d) * 0.1)
        self.att = nn.MultiheadAttention(d, 2, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, input_ids, attention_mask):
        h = self.emb(input_ids) + self.pos
        h = h + self.att(h, h, h, need_weights=False)[0]
        return {"logits": self.head(h) * attention_mask[..., None]}


def test_a_tiny_language_model_is_exact() -> None:
    """Tokens, a mask, labels padded with -100, a vocabulary above the pairwise softmax's
    limit: every family exact against the brute force."""
    torch.manual_seed(10)
    model = TinyLM()
    g = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(0, 80, (2, 3), generator=g),
        "attention_mask": torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]),
    }
    labels = torch.randint(0, 80, (2, 3), generator=g)
    labels[1, 2] = -100  # the padded token
    loss = make_loss("cross_entropy", class_dim=-1)
    got = exact_diagonals(model, batch, labels, loss=loss, output="logits")
    assert_exact(got, brute_force(model, batch, labels, loss, output="logits"), 1e-9)
