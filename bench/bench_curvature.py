"""Exact curvature diagonals: fathom ``exact_diagonals`` vs BackPACK vs naive vmap, and the floor.

Part 1 (issue 12), float64, probe N = ``--probe``, C = 10, timings interleaved over
``--repeats``, medians:

* **residual CNN with BatchNorm** (eval; conv stem, two residual blocks, a strided
  downsampling conv, a residual block at the new width, 2x2 max pooling, linear head):
  - fathom ``exact_diagonals`` (GGN, empirical Fisher and Jacobian Gram, all three);
  - BackPACK 1.7 ``DiagGGNExact`` on the mean CE (``extend(..., use_converter=True)`` for the
    residual graph) — the GGN alone — and its three-pass equivalent of what fathom returns
    (DiagGGNExact + SumGradSquared on the summed CE, DiagGGNExact on a summed MSE for JᵀJ);
  - naive: ``vmap(jacrev)`` full per-example Jacobians ``J_i [C, P]``, then the diagonals;
  - **pullback floor**: one forward plus the ``C`` vector-Jacobian products of the unit
    logit directions back to every parameter through the same network, summed over the
    examples (``autograd.grad(logits, params, e_c)``), with no per-example split and no
    diagonal accumulation; measured two ways in the same run (one vmapped reverse pass with
    ``is_grads_batched=True``, and ``C`` reverse passes of one graph) and the faster one is
    the floor. Any exact diagonal needs at least this work.
* **tiny transformer block** (Embedding, LayerNorm, ``nn.MultiheadAttention``, MLP), which
  BackPACK refuses: fathom vs naive vmap vs the floor.

Part 2: the Ciresan-width plain MLP (issue 5's comparison) with ``exact_diagonals``.
Part 3: wall time of ``run_curvature`` over 7 checkpoints of 3 synthesized run directories.

Usage: python bench/bench_curvature.py [--probe 64] [--repeats 7] [--threads 2] [--skip-mlp]
       [--skip-protocol] [--device cpu]
BackPACK is a dev-only dependency: ``pip install --no-deps backpack-for-pytorch einops unfoldNd``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call, jacrev, vmap

from fathom.curvature import exact_diagonals

DT = torch.float64
EPOCHS = (0, 1, 5, 10, 20, 50, 100)


class ResidualBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.act1, self.act2 = nn.ReLU(), nn.ReLU()  # modules, so BackPACK's converter can see them

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act1(self.bn1(self.conv1(x)))
        return self.act2(x + self.bn2(self.conv2(h)))


class ResidualCNN(nn.Module):
    """1 x side x side -> 16 ch -> 2 blocks -> 32 ch (stride 2) -> 1 block -> 2x2 max pool -> 10.

    (Max, not average, pooling: BackPACK 1.7's average-pool derivative builds a float32
    transposed convolution and fails in float64.)"""

    def __init__(self, width: int = 16, side: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.stage1 = nn.Sequential(ResidualBlock(width), ResidualBlock(width))
        self.down = nn.Sequential(
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
        )
        self.stage2 = ResidualBlock(2 * width)
        self.pool = nn.MaxPool2d(2)
        self.flat = nn.Flatten()
        self.head = nn.Linear(2 * width * (side // 4) ** 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(self.flat(self.pool(h)))


class TransformerBlock(nn.Module):
    """Tokens -> Embedding + learned positions -> pre-LN attention and MLP -> mean pool -> 10."""

    def __init__(self, vocab: int = 100, length: int = 16, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(length, dim) * 0.1)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos
        a = self.ln1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.mlp(self.ln2(h))
        return self.head(h.mean(1))


def randomize_bn(model: nn.Module) -> nn.Module:
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.2)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model


def naive_diagonals(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Full per-example Jacobians by ``vmap(jacrev)``, then the three diagonals."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def logits_one(p: dict, xi: torch.Tensor) -> torch.Tensor:
        return functional_call(model, p, (xi[None],))[0]

    jac = vmap(jacrev(logits_one), in_dims=(None, 0))(params, x)
    logits = model(x).detach()
    prob = torch.softmax(logits, -1)
    sqrt_h = (torch.eye(10, dtype=DT)[None] - prob[:, :, None]) * prob.sqrt()[:, None, :]
    resid = prob - nn.functional.one_hot(y, 10).to(DT)
    n, out = x.shape[0], {"ggn": {}, "fisher": {}, "jacobian": {}}
    for name, j in jac.items():
        jf, shape = j.reshape(n, 10, -1), j.shape[2:]
        ggn = torch.einsum("ick,icp->ikp", sqrt_h, jf).square().sum((0, 1))
        out["ggn"][name] = (ggn / n).reshape(shape)
        out["fisher"][name] = (torch.einsum("ic,icp->ip", resid, jf).square().sum(0) / n).reshape(
            shape
        )
        out["jacobian"][name] = (jf.square().sum((0, 1)) / n).reshape(shape)
    return out


def pullback_floor(model: nn.Module, x: torch.Tensor, batched: bool) -> None:
    """Forward + C VJPs of the logits to every parameter (the floor, module docstring):
    one vmapped reverse pass (``is_grads_batched``) or C reverse passes of one graph."""
    params = list(model.parameters())
    logits = model(x)
    eye = torch.eye(10, dtype=DT)[:, None, :].expand(10, x.shape[0], 10)
    if batched:
        torch.autograd.grad(logits, params, eye, is_grads_batched=True)
        return
    for c in range(10):
        torch.autograd.grad(logits, params, eye[c], retain_graph=c < 9)


FLOORS = {
    "floor: C VJPs, one batched pass": True,
    "floor: C VJPs, C passes": False,
}


def with_floor(med: dict[str, float]) -> dict[str, float]:
    """Add ``pullback floor`` = the faster of the two floor measurements of the same run."""
    return {"pullback floor": min(med[k] for k in FLOORS), **med}


def backpack_ggn(bp_model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    from backpack import backpack, extend
    from backpack.extensions import DiagGGNExact

    bp_model.zero_grad(set_to_none=True)
    loss = extend(nn.CrossEntropyLoss())(bp_model(x), y)
    with backpack(DiagGGNExact()):
        loss.backward()
    return [p.diag_ggn_exact for p in bp_model.parameters()]


def backpack_three(bp_model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, list]:
    """GGN, empirical Fisher, Jacobian Gram with BackPACK, normalized as fathom (three passes)."""
    from backpack import backpack, extend
    from backpack.extensions import DiagGGNExact, SumGradSquared

    n, out = x.shape[0], {}
    bp_model.zero_grad(set_to_none=True)
    with backpack(DiagGGNExact(), SumGradSquared()):
        extend(nn.CrossEntropyLoss(reduction="sum"))(bp_model(x), y).backward()
    out["ggn"] = [p.diag_ggn_exact / n for p in bp_model.parameters()]
    out["fisher"] = [p.sum_grad_squared / n for p in bp_model.parameters()]
    bp_model.zero_grad(set_to_none=True)
    logits = bp_model(x)
    with backpack(DiagGGNExact()):
        extend(nn.MSELoss(reduction="sum"))(logits, torch.zeros_like(logits)).backward()
    out["jacobian"] = [p.diag_ggn_exact / (2 * n) for p in bp_model.parameters()]
    return out


def max_rel(ours: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    """Worst parameter's ``max |ours - ref| / max |ref|``."""
    return max(
        float((a - b).abs().max()) / float(b.abs().max())
        for a, b in zip(ours, ref, strict=True)
        if float(b.abs().max()) > 0
    )


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Medians (seconds) of ``repeats`` rounds, each round running every function once."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()  # warm-up
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def report(title: str, med: dict[str, float], base: str, extra: list[str]) -> None:
    print(f"## {title}")
    for k, v in med.items():
        print(f"{k:<42}: {v * 1e3:9.1f} ms   ({v / med[base]:.2f}x {base})")
    for line in extra:
        print(line)


def bench_cnn(probe: int, repeats: int, side: int) -> None:
    from backpack import extend

    torch.manual_seed(0)
    model = randomize_bn(ResidualCNN(side=side)).to(DT).eval()
    x = torch.randn(probe, 1, side, side, dtype=DT)
    y = torch.randint(0, 10, (probe,))
    bp_model = extend(randomize_bn(ResidualCNN(side=side)).to(DT).eval(), use_converter=True)
    bp_model.load_state_dict(model.state_dict())
    ours = exact_diagonals(model, x, y)
    names = [n for n, _ in model.named_parameters()]
    rel_ggn = max_rel([ours["ggn"][n] for n in names], backpack_ggn(bp_model, x, y))
    three = backpack_three(bp_model, x, y)
    rel3 = {k: max_rel([ours[k][n] for n in names], three[k]) for k in three}
    sub = slice(0, min(probe, 16))
    naive = naive_diagonals(model, x[sub], y[sub])
    small = exact_diagonals(model, x[sub], y[sub])
    rel_naive = max(
        max_rel([small[k][n] for n in names], [naive[k][n] for n in names]) for k in naive
    )
    params = sum(p.numel() for p in model.parameters())
    med = with_floor(
        interleaved(
            {
                **{k: (lambda b=b: pullback_floor(model, x, b)) for k, b in FLOORS.items()},
                "fathom exact_diagonals (GGN+EF+Jac)": lambda: exact_diagonals(model, x, y),
                "BackPACK DiagGGNExact (GGN only)": lambda: backpack_ggn(bp_model, x, y),
                "BackPACK three passes (GGN+EF+Jac)": lambda: backpack_three(bp_model, x, y),
                "naive vmap(jacrev) (GGN+EF+Jac)": lambda: naive_diagonals(model, x, y),
            },
            repeats,
        )
    )
    base = "pullback floor"
    fathom = med["fathom exact_diagonals (GGN+EF+Jac)"]
    report(
        f"residual CNN with BatchNorm (eval), {params:,} params, 1x{side}x{side}, N={probe}, C=10, float64",
        med,
        base,
        [
            f"BackPACK GGN / fathom: {med['BackPACK DiagGGNExact (GGN only)'] / fathom:.2f}x; "
            f"BackPACK three / fathom: {med['BackPACK three passes (GGN+EF+Jac)'] / fathom:.2f}x; "
            f"fathom / floor: {fathom / med[base]:.2f}x",
            f"max rel diff vs BackPACK: GGN {rel_ggn:.1e}; "
            + ", ".join(f"{k} {v:.1e}" for k, v in rel3.items())
            + f"; vs naive vmap (N={sub.stop}): {rel_naive:.1e}",
        ],
    )


def bench_transformer(probe: int, repeats: int) -> None:
    from backpack import backpack, extend
    from backpack.extensions import DiagGGNExact

    torch.manual_seed(0)
    model = TransformerBlock().to(DT).eval()
    x = torch.randint(0, 100, (probe, 16))
    y = torch.randint(0, 10, (probe,))
    try:
        bp = extend(TransformerBlock().to(DT).eval(), use_converter=True)
        with backpack(DiagGGNExact()):
            extend(nn.CrossEntropyLoss())(bp(x), y).backward()
        refusal = "BackPACK ran (unexpected)"
    except Exception as err:  # what BackPACK says about this model
        refusal = f"BackPACK refuses: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
    sub = slice(0, min(probe, 16))
    ours, naive = exact_diagonals(model, x[sub], y[sub]), naive_diagonals(model, x[sub], y[sub])
    rel = max(max_rel(list(ours[k].values()), list(naive[k].values())) for k in naive)
    params = sum(p.numel() for p in model.parameters())
    med = with_floor(
        interleaved(
            {
                **{k: (lambda b=b: pullback_floor(model, x, b)) for k, b in FLOORS.items()},
                "fathom exact_diagonals (GGN+EF+Jac)": lambda: exact_diagonals(model, x, y),
                "naive vmap(jacrev) (GGN+EF+Jac)": lambda: naive_diagonals(model, x, y),
            },
            repeats,
        )
    )
    report(
        f"transformer block (Embedding, LayerNorm, MultiheadAttention, MLP), {params:,} params, "
        f"seq 16, N={probe}, C=10, float64",
        med,
        "pullback floor",
        [refusal, f"max rel diff fathom vs naive vmap (N={sub.stop}): {rel:.1e}"],
    )


def bench_mlp(probe: int, repeats: int, width_mult: float) -> None:
    import itertools

    from fathom.models.ciresan import FULL_WIDTHS, scaled_widths

    dims = (784, *scaled_widths(FULL_WIDTHS, width_mult))
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.ReLU()]
    torch.manual_seed(0)
    model = nn.Sequential(*layers, nn.Linear(dims[-1], 10)).to(DT)
    from backpack import extend

    bp_model = extend(
        nn.Sequential(
            *[
                type(m)(m.in_features, m.out_features) if isinstance(m, nn.Linear) else nn.ReLU()
                for m in model
            ]
        ).to(DT)
    )
    bp_model.load_state_dict(model.state_dict())
    x = torch.rand(probe, 784, dtype=DT)
    y = torch.randint(0, 10, (probe,))
    med = with_floor(
        interleaved(
            {
                **{k: (lambda b=b: pullback_floor(model, x, b)) for k, b in FLOORS.items()},
                "fathom exact_diagonals (GGN+EF+Jac)": lambda: exact_diagonals(model, x, y),
                "BackPACK DiagGGNExact (GGN only)": lambda: backpack_ggn(bp_model, x, y),
                "BackPACK three passes (GGN+EF+Jac)": lambda: backpack_three(bp_model, x, y),
            },
            repeats,
        )
    )
    params = sum(p.numel() for p in model.parameters())
    report(
        f"plain MLP {'-'.join(map(str, dims))}-10, {params:,} params, N={probe}",
        med,
        "pullback floor",
        [],
    )


def bench_protocol(probe: int) -> None:
    from fathom.config import ModelConfig, RunConfig
    from fathom.curvature.rundir import run_curvature
    from fathom.data.splits import DataSplits
    from fathom.io import atomic_write_json
    from fathom.rundir import RunDir
    from fathom.train.build import build_model
    from fathom.train.checkpoint import cpu_state, save_weights

    class SyntheticRunDir(RunDir):
        def load_splits(self, device="cpu") -> DataSplits:
            g = torch.Generator().manual_seed(1)
            xs = torch.randint(0, 256, (512, 784), generator=g, dtype=torch.uint8)
            ys = torch.randint(0, 10, (512,), generator=g)
            return DataSplits(xs, ys, xs[:1], ys[:1], xs[:1], ys[:1], split_hash="synthetic")

    with tempfile.TemporaryDirectory() as tmp:
        root, per = Path(tmp), []
        t0 = time.perf_counter()
        for recipe in ("residual", "sd_constant", "sd_decreasing"):
            cfg = RunConfig(name=recipe, model=ModelConfig(recipe=recipe, width_mult=0.04))
            torch.manual_seed(101)
            model = build_model(cfg.model)
            ckpts = {}
            for e in EPOCHS:
                rel = f"checkpoints/epoch-{e:04d}.safetensors"
                digest = save_weights(root / recipe / rel, cpu_state(model), {"epoch": e})
                ckpts[str(e)] = {"file": rel, "params_sha256": digest}
            manifest = {
                "format": 2,
                "kind": "run",
                "status": "complete",
                "run_id": recipe,
                "config": cfg.model_dump(mode="json"),
            }
            atomic_write_json(
                root / recipe / "manifest.json",
                {**manifest, "checkpoints": ckpts, "data": {"info": {}}},
            )
            rows = run_curvature(
                SyntheticRunDir(root / recipe),
                list(EPOCHS),
                probe=probe,
                out_dir=root / "out" / recipe,
            )
            per += [r["runtime_s"] for r in rows]
        total = time.perf_counter() - t0
    print(
        f"## 21-snapshot protocol (synthesized checkpoints, CiresanMLP width x 0.04), probe N={probe}"
    )
    print(f"total wall {total:.2f} s; per snapshot median {statistics.median(per) * 1e3:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--side", type=int, default=16, help="CNN image side (multiple of 4)")
    ap.add_argument("--mlp-width-mult", type=float, default=0.25)
    ap.add_argument("--skip-mlp", action="store_true")
    ap.add_argument("--skip-protocol", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}; "
        f"load average at start {os.getloadavg()[0]:.2f}; repeats {args.repeats} (interleaved), medians"
    )
    bench_cnn(args.probe, args.repeats, args.side)
    bench_transformer(args.probe, args.repeats)
    if not args.skip_mlp:
        bench_mlp(128, args.repeats, args.mlp_width_mult)
    if not args.skip_protocol:
        bench_protocol(128)
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
