"""The seam against float64 torch.func brute force, on every model of the zoo."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fathom.errors import FathomError
from fathom.seam import discover
from fathom.seam.pex import per_example_grads, per_example_grams
from model_zoo import CASES, IDS, brute_force_grads, make


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach(), want.detach()
    return float((got - want).norm() / want.norm().clamp_min(1e-300))


def seam_grads(model, x, y):
    seam = discover(model, x)
    with seam.capture() as calls:
        logits = model(x)
    total = F.cross_entropy(logits, y, reduction="sum")
    cots = seam.cotangents(calls, total)
    return seam, calls, cots


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_per_example_grads_match_brute_force(case) -> None:
    model, x, y = make(case)
    want = brute_force_grads(model, x, y)
    seam, calls, cots = seam_grads(model, x, y)
    covered = set()
    for layer in seam.layers:
        got = per_example_grads(layer, calls[layer.name], cots[layer.name], len(y))
        grams = per_example_grams(layer, calls[layer.name], cots[layer.name], len(y))
        for local, q in zip(layer.params, layer.qualified, strict=True):
            assert rel_err(got[local], want[q]) <= 1e-9, (layer.name, local)
            flat = want[q].reshape(len(y), -1)
            assert rel_err(grams[local], flat @ flat.T) <= 1e-9, (layer.name, local)
            covered.add(q)
    assert covered == {n for n, p in model.named_parameters()}
    assert all(" (" in c and "path" not in c for c in seam.coverage.values())


def test_kinds_and_coverage_of_the_transformer() -> None:
    model, x, _ = make(CASES[IDS.index("transformer")])
    seam = discover(model, x)
    kinds = {layer.name: layer.kind for layer in seam.layers}
    assert kinds == {
        "embed": "embedding",
        "ln": "layernorm",
        "attn": "attention",
        "mlp": "linear",
        "head": "linear",
    }
    assert seam.coverage["attn.out_proj.weight"].startswith(
        "attn (MultiheadAttention, fast attention"
    )
    assert seam.layer("attn").params == (
        "in_proj_weight",
        "in_proj_bias",
        "out_proj.weight",
        "out_proj.bias",
    )


def test_conv_kinds_and_spiking_fold() -> None:
    model, x, _ = make(CASES[IDS.index("staged_lif")])
    seam = discover(model, x)
    kinds = {layer.name: layer.kind for layer in seam.layers}
    assert kinds["blocks.0.body.0"] == "conv2d"
    assert kinds["blocks.1.body.branch.1"] == "batchnorm"
    assert kinds["classifier"] == "linear"
    with seam.capture() as calls:
        model(x)
    # time-folded [B * T, ...]: T = 2 entries per example
    assert calls["classifier"][0].in_dims[0] == (0, 2)


def test_directions_are_stacked_pullbacks() -> None:
    model, x, y = make(CASES[IDS.index("transformer")])
    seam = discover(model, x)
    with seam.capture() as calls:
        logits = model(x)
    dirs = torch.randn(3, *logits.shape, dtype=torch.float64)
    cots = seam.cotangents(calls, logits, dirs, directions=True, retain_graph=True)
    for layer in seam.layers:
        got = per_example_grads(layer, calls[layer.name], cots[layer.name], len(y), directions=True)
        for d in range(3):
            one = seam.cotangents(calls, logits, dirs[d], retain_graph=True)
            ref = per_example_grads(layer, calls[layer.name], one[layer.name], len(y))
            for k in ref:
                assert rel_err(got[k][d], ref[k]) <= 1e-12, (layer.name, k, d)


class Prototypes(nn.Module):
    """``-cdist(h, W)``: torch's batched (vmap) pullback of cdist's backward is wrong."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, 4, dtype=torch.float64))

    def forward(self, h):
        return -torch.cdist(h, self.weight)


@pytest.mark.parametrize("block", ["cdist", "prelu"])
def test_layers_whose_batched_pullback_fails_take_directions_one_at_a_time(block) -> None:
    """The self-check's stacked directions against a loop: ``torch.cdist`` (vmap of its
    backward over directions is wrong: a Jacobian Gram off by 0.55) and ``nn.PReLU`` (no
    batching rule: a RuntimeError) are exact, one direction at a time, said in the coverage."""
    torch.manual_seed(0)
    inner = Prototypes() if block == "cdist" else nn.PReLU(4).double()
    width = 5 if block == "cdist" else 4
    model = nn.Sequential(nn.Linear(3, 4), inner, nn.Tanh(), nn.Linear(width, 3)).double()
    x = torch.randn(4, 3, dtype=torch.float64)
    seam = discover(model, x)
    assert [la.loop_directions for la in seam.layers] == [False, True, False]
    assert seam.coverage["1.weight"].endswith("one output direction at a time)")
    with seam.capture() as calls:
        logits = model(x)
    dirs = torch.randn(3, *logits.shape, dtype=torch.float64)
    cots = seam.cotangents(calls, logits, dirs, directions=True, retain_graph=True)
    layer = seam.layers[1]
    got = per_example_grads(layer, calls["1"], cots["1"], 4, directions=True)["weight"]
    for d in range(3):
        want = torch.stack(  # example i alone: the gradient of <dirs[d, i], logits_i>
            [
                torch.autograd.grad(model(x[i : i + 1])[0] @ dirs[d, i], inner.weight)[0]
                for i in range(4)
            ]
        )
        assert rel_err(got[d], want) <= 1e-12, d


def test_a_wrong_stacked_pullback_to_the_layer_outputs_is_looped(monkeypatch) -> None:
    """Where autograd's ``is_grads_batched`` pullback disagrees with one direction at a time
    (simulated: scaled), the seam pulls its directions back one at a time."""
    import fathom.seam as seam_module

    real = seam_module.pullback

    def wrong(outputs, leaves, grad_outputs, directions, retain_graph, batched=True):
        out = real(outputs, leaves, grad_outputs, directions, retain_graph, batched)
        return [g if g is None or not (directions and batched) else 1.5 * g for g in out]

    monkeypatch.setattr(seam_module, "pullback", wrong)
    model, x, _ = make(CASES[IDS.index("transformer")])
    seam = discover(model, x)
    assert not seam.batched_pullback
    with seam.capture() as calls:
        logits = model(x)
    dirs = torch.randn(2, *logits.shape, dtype=torch.float64)
    cots = seam.cotangents(calls, logits, dirs, directions=True, retain_graph=True)
    one = seam.cotangents(calls, logits, dirs[1], retain_graph=True)
    layer = seam.layers[-1]
    assert torch.equal(cots[layer.name][0][0][1], one[layer.name][0][0])


class Temperature(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 3)
        self.t = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        return self.body(x) * self.t


def test_parameter_of_the_root_is_covered_by_the_root() -> None:
    model = Temperature().double()
    x = torch.randn(5, 4, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1])
    seam, calls, cots = seam_grads(model, x, y)
    root = seam.layer("<model>")
    assert root.params == ("t",) and root.kind == "op"
    assert (
        seam.coverage["t"]
        == "<model> (Temperature, root operations (mul), each alone, x + p closed-form, others by torch.func)"
    )
    got = per_example_grads(root, calls[root.name], cots[root.name], 5)["t"]
    assert rel_err(got, brute_force_grads(model, x, y)["t"]) <= 1e-9


def test_no_parameters_refused() -> None:
    with pytest.raises(FathomError, match="no parameters"):
        discover(nn.Sequential(nn.ReLU()), torch.randn(4, 3))


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (nn.Sequential(nn.Linear(4, 3), nn.Flatten(0)), "logits shaped"),
        (nn.Sequential(nn.Linear(4, 3), nn.Unflatten(1, (3, 1))), "logits shaped"),
        (nn.Linear(4, 1), r"1 logit\(s\) per example \(\[N, 1\]\).*at least two"),
    ],
)
def test_not_logits_refused(model, match) -> None:
    with pytest.raises(FathomError, match=match):
        discover(model, torch.randn(4, 4))


def test_one_logit_output_is_refused_not_an_all_zero_curvature() -> None:
    """Counter-example: a ``[N, 1]`` output was accepted, and its cross-entropy (softmax of one
    logit is 1) gave an all-zero GGN and Fisher with exit 0."""
    from fathom.curvature import exact_diagonals

    model, x = nn.Linear(4, 1), torch.randn(5, 4)
    with pytest.raises(FathomError, match=r"\[N, 1\].*zero"):
        exact_diagonals(model, x, torch.zeros(5, dtype=torch.long))


class ArgMax(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(x).argmax(dim=1, keepdim=True).expand(-1, 3)


def test_integer_outputs_refused() -> None:
    with pytest.raises(FathomError, match="int64 outputs"):
        discover(ArgMax(), torch.randn(4, 4))


def test_batchnorm_in_train_mode_refused_with_reason() -> None:
    model, x, _ = make(CASES[IDS.index("bn_cnn")])
    model.train()
    with pytest.raises(
        FathomError,
        match=r"BatchNorm module '1' is in train\(\) mode.*depends on every other example",
    ):
        discover(model, x)


class InPlaceState(nn.Module):
    """Data-dependent control flow on a host read: vmap cannot batch it."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x):
        out = x * self.scale
        if float(out.sum()) > -1e30:  # host read: data-dependent control flow
            return out
        return -out


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.odd = InPlaceState()

    def forward(self, x):
        return self.odd(self.lin(x))


def test_module_torch_func_cannot_differentiate_is_named() -> None:
    with pytest.raises(
        FathomError, match=r"module 'odd' \(InPlaceState\) cannot be differentiated"
    ):
        discover(Net(), torch.randn(5, 4))


class StaleView(nn.Module):
    """Uses a tensor derived from a parameter at construction: no forward sees the parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.w = nn.Parameter(torch.randn(3, 4))
        self.w_scaled = self.w * 2.0

    def forward(self, x):
        return self.lin(x) + x @ self.w_scaled.T


def test_parameter_used_outside_any_forward_refused() -> None:
    with pytest.raises(FathomError, match=r"parameter 'w' \(module '<model>'\) receives gradient"):
        discover(StaleView(), torch.randn(5, 4))


def test_skipped_branch_records_nothing() -> None:
    model, x, y = make(CASES[IDS.index("residual_mlp")])
    seam = discover(model, x)
    model.blocks[1].mask = False  # an explicit deletion: the branch is not called
    with seam.capture() as calls:
        model(x)
    assert calls["blocks.1.branch.0"] == []
    assert len(calls["blocks.0.branch.0"]) == 1
    grads = per_example_grads(seam.layer("blocks.1.branch.0"), [], [], len(y))
    assert float(grads["weight"].abs().sum()) == 0.0


def test_in_place_modified_output_refused_at_discovery() -> None:
    """The self-check runs every layer (fast ones too), so an in-place change of a recorded
    output is refused when the seam is found, not later inside an instrument."""
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(inplace=True), nn.Linear(3, 2))
    with pytest.raises(FathomError, match="modified in place"):
        discover(model, torch.randn(5, 4))
