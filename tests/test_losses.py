"""fathom.losses: every loss equals torch's own (value and autograd gradient, float64), its
Hessian square-root directions reproduce torch's Hessian of the reduced loss per example,
and a layout or target that does not fit is refused by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.errors import FathomError
from fathom.losses import make_loss, read_output

torch.set_num_threads(1)


def _ce(**kw):
    def ref(z, y, cd):
        zz = z if cd in (None, 1) else z.movedim(cd, 1)
        yy = y if not y.is_floating_point() or cd in (None, 1) else y.movedim(cd, 1)
        return F.cross_entropy(zz, yy, **kw)

    return ref


def _case(kind: str, shape: tuple, cd, seed: int, **kw):
    """``(loss, z, y, ref)``: a loss, a float64 output, a target and torch's reduced loss."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(shape, generator=g, dtype=torch.float64) * 2
    if kind == "ce_int":
        cdim = 1 if cd is None else cd % len(shape)
        pos = shape[:cdim] + shape[cdim + 1 :]
        y = torch.randint(0, shape[cdim], pos, generator=g)
        y.view(-1)[0] = -100 if y.numel() > 1 else y.view(-1)[0]
        loss = make_loss("cross_entropy", class_dim=cd, **kw)
        return loss, z, y, lambda q: _ce(**kw)(q, y, cd)
    if kind == "ce_prob":
        y = torch.rand(shape, generator=g, dtype=torch.float64)
        cdim = 1 if cd is None else cd
        y = y / y.sum(cdim, keepdim=True)
        loss = make_loss("cross_entropy", class_dim=cd, **kw)
        return loss, z, y, lambda q: _ce(**kw)(q, y, cd)
    y = torch.rand(shape, generator=g, dtype=torch.float64)
    if kind == "mse":
        return make_loss("mse", **kw), z, y, lambda q: F.mse_loss(q, y, **kw)
    return (
        make_loss("bce_with_logits", **kw),
        z,
        y,
        lambda q: F.binary_cross_entropy_with_logits(q, y, **kw),
    )


def check_against_torch(loss, z, y, ref) -> None:
    terms = loss.terms(z, y)
    zg = z.clone().requires_grad_()
    want = ref(zg)
    (grad,) = torch.autograd.grad(want, zg)
    torch.testing.assert_close(terms.value(z), want.detach(), rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(terms.residual(z), grad, rtol=1e-12, atol=1e-15)
    h = torch.autograd.functional.hessian(ref, z)
    n, e = z.shape[0], z[0].numel()
    h = h.reshape(n, e, n, e)
    d = terms.directions(z)
    assert d.shape[1:] == z.shape
    for i in range(n):
        di = d[:, i].reshape(d.shape[0], -1)
        torch.testing.assert_close(di.T @ di, h[i, :, i], rtol=1e-10, atol=1e-14)


CASES = [
    ("ce_int", (4, 5), None, {}),
    ("ce_int", (4, 5), None, {"reduction": "sum"}),
    ("ce_int", (4, 5), None, {"label_smoothing": 0.2}),
    ("ce_int", (2, 3, 4, 2), 1, {"label_smoothing": 0.1}),
    ("ce_int", (2, 4, 3), -1, {"reduction": "sum"}),
    ("ce_prob", (3, 4), None, {}),
    ("ce_prob", (2, 4, 3), -1, {"label_smoothing": 0.3}),
    ("mse", (3, 4), None, {}),
    ("mse", (3, 2, 2), None, {"reduction": "sum"}),
    ("mse", (5,), None, {}),
    ("bce", (3, 4), None, {}),
    ("bce", (2, 3, 2), None, {"reduction": "sum"}),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in CASES])
def test_losses_equal_torch_in_value_gradient_and_hessian(case) -> None:
    kind, shape, cd, kw = case
    check_against_torch(*_case(kind, shape, cd, 0, **{k: v for k, v in kw.items()}))


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(["ce_int", "ce_prob", "mse", "bce"]),
    n=st.integers(1, 3),
    extra=st.lists(st.integers(1, 3), max_size=2),
    classes=st.integers(2, 4),
    last=st.booleans(),
    reduction=st.sampled_from(["mean", "sum"]),
    smoothing=st.sampled_from([0.0, 0.25]),
    seed=st.integers(0, 9),
)
@example(
    kind="ce_int", n=1, extra=[], classes=2, last=False, reduction="mean", smoothing=0.0, seed=0
)
def test_generated_losses_equal_torch(kind, n, extra, classes, last, reduction, smoothing, seed):
    ce = kind.startswith("ce")
    shape = (n, *extra, classes) if last else (n, classes, *extra)
    cd = (-1 if extra else None) if last else (1 if extra else None)
    kw = {"reduction": reduction}
    if ce:
        kw["label_smoothing"] = smoothing
    loss, z, y, ref = _case(kind, shape, cd, seed, **kw)
    if kind == "ce_int" and bool((y == -100).all()):
        with pytest.raises(FathomError, match="every position"):
            loss.terms(z, y)
        return
    check_against_torch(loss, z, y, ref)


def test_one_logit_cross_entropy_is_refused_by_name() -> None:
    with pytest.raises(FathomError, match=r"\[N, 1\].*zero"):
        make_loss("cross_entropy").layout((4, 1))
    make_loss("bce_with_logits").layout((4, 1))  # one logit per label: fine


@pytest.mark.parametrize(
    ("kind", "kw", "match"),
    [
        ("cross_entropie", {}, "did you mean 'cross_entropy'"),
        ("mse", {"ignore_index": 3}, "takes no option 'ignore_index'"),
        ("cross_entropy", {"reduction": "avg"}, "reduction='avg'"),
        ("cross_entropy", {"label_smoothing": 1.5}, "label_smoothing"),
    ],
)
def test_bad_loss_names_and_options_are_refused(kind, kw, match) -> None:
    with pytest.raises(FathomError, match=match):
        make_loss(kind, **kw)


@pytest.mark.parametrize(
    ("loss", "shape", "y", "match"),
    [
        (make_loss(), (3, 4, 5), torch.zeros(3, 5, dtype=torch.long), "class_dim=1.*class_dim=-1"),
        (make_loss(), (3,), torch.zeros(3, dtype=torch.long), "logits shaped"),
        (make_loss(), (3, 4), torch.zeros(3, 1, dtype=torch.long), "shape \\[3\\]"),
        (make_loss(), (3, 4), torch.tensor([0, 4, 1]), "lie in \\[0, 4\\)"),
        (make_loss(), (2, 4), torch.full((2,), -100), "every position"),
        (
            make_loss(class_dim=-1),
            (2, 3, 4),
            torch.zeros(2, 4, dtype=torch.long),
            "shape \\[2, 3\\]",
        ),
        (make_loss(), (2, 4), -torch.ones(2, 4), "non-negative"),
        (make_loss("mse"), (2, 4), torch.zeros(2, 4, dtype=torch.long), "floating"),
        (make_loss("mse"), (2, 4), torch.zeros(2, 1), "output's shape"),
        (
            make_loss("cross_entropy", class_dim=0),
            (2, 4),
            torch.zeros(2, dtype=torch.long),
            "class_dim=0",
        ),
    ],
)
def test_targets_and_layouts_that_do_not_fit_are_refused(loss, shape, y, match) -> None:
    with pytest.raises(FathomError, match=match):
        loss.terms(torch.zeros(shape, dtype=torch.float64), y)


def test_read_output_selects_by_key_or_index_and_refuses_otherwise() -> None:
    z = torch.randn(2, 3)
    ce = make_loss()
    assert read_output({"logits": z, "aux": 1}, 2, ce, "logits") is z
    assert read_output((z, None), 2, ce, 0) is z
    with pytest.raises(FathomError, match="keys \\['logits'\\].*output='<key>'"):
        read_output({"logits": z}, 2, ce)
    with pytest.raises(FathomError, match="output=<index>"):
        read_output((z,), 2, ce)
    with pytest.raises(FathomError, match="no such key"):
        read_output({"logits": z}, 2, ce, "scores")
    with pytest.raises(FathomError, match="floating-point"):
        read_output(torch.zeros(2, 3, dtype=torch.long), 2, ce)


@pytest.mark.parametrize("scale", [1.0, 30.0, 500.0])
def test_linear_memory_softmax_parts_equal_the_pairwise_ones(scale, monkeypatch) -> None:
    """Above PAIRWISE_CLASSES classes the softmax pieces take [N, C] memory: the same
    numbers as the pairwise complement form (outside the subnormal range)."""
    import fathom.losses.softmax as S

    z = torch.randn(20, 100, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    z = z * scale
    linear = S.softmax_parts(z)
    monkeypatch.setattr(S, "PAIRWISE_CLASSES", 10**9)
    pairwise = S.softmax_parts(z)
    for field in ("p", "one_minus_p", "log_p"):
        a, b = getattr(linear, field), getattr(pairwise, field)
        normal = b.abs() > 1e-290
        assert float(((a - b).abs()[normal] / b.abs()[normal]).max()) < 1e-12, field


def test_a_large_vocabulary_sequence_loss_equals_torch() -> None:
    g = torch.Generator().manual_seed(1)
    z = torch.randn(2, 3, 5000, dtype=torch.float64, generator=g) * 4
    y = torch.randint(0, 5000, (2, 3), generator=g)
    check = make_loss("cross_entropy", class_dim=-1, label_smoothing=0.1)
    zg = z.clone().requires_grad_()
    want = F.cross_entropy(zg.transpose(1, 2), y, label_smoothing=0.1)
    (grad,) = torch.autograd.grad(want, zg)
    terms = check.terms(z, y)
    torch.testing.assert_close(terms.value(z), want.detach(), rtol=1e-13, atol=0)
    torch.testing.assert_close(terms.residual(z), grad, rtol=1e-10, atol=1e-18)
