"""Exact curvature diagonals: fathom ``exact_diagonals`` vs BackPACK vs naive vmap, and the floor.

Part 1, float64, probe N = ``--probe``, C = 10, timings interleaved over
``--repeats`` rounds (each round runs every method once, after one warm-up each), medians;
with ``--threads 1`` (the default) on the calling thread's CPU clock (``time.thread_time``:
user + system time of this thread, so other engineers' jobs on the shared machine do not
enter), else wall time:

* **residual CNN with BatchNorm** (eval; conv stem, two residual blocks, a strided
  downsampling conv, a residual block at the new width, 2x2 max pooling, linear head):
  - fathom ``exact_diagonals``: all three families (GGN, empirical Fisher, Jacobian Gram),
    and ``families="ggn"`` (the GGN alone);
  - BackPACK 1.7 ``DiagGGNExact`` on the mean CE (``extend(..., use_converter=True)`` for the
    residual graph) — the GGN alone — and its three-pass equivalent of what fathom returns
    (DiagGGNExact + SumGradSquared on the summed CE, DiagGGNExact on a summed MSE for JᵀJ);
  - naive: ``vmap(jacrev)`` full per-example Jacobians ``J_i [C, P]``, then the diagonals;
  - **pullback floor** (``bench/curvature_floor.py``): forward + the ``C`` unit logit
    directions pulled back to every parameter, summed over the examples (no per-example
    split, no diagonal accumulation), measured three ways in the same rounds; the fastest
    is the floor.
* **tiny transformer block** (Embedding, LayerNorm, ``nn.MultiheadAttention``, MLP), which
  BackPACK refuses: fathom (all three; GGN alone) vs naive vmap vs the floor.

Every method runs under the same CPU allocator settings: glibc's thresholds as ``fathom
train`` sets them (``fathom.train.allocator``; ``exact_diagonals`` applies them on its first
call), applied here before any timing.

Part 2: the Ciresan-width plain MLP (the seed's comparison) with ``exact_diagonals``.
Part 3: wall time of ``run_curvature`` over 7 checkpoints of 3 synthesized run directories.

Usage: python bench/bench_curvature.py [--probe 32] [--repeats 7] [--threads 1] [--skip-mlp]
       [--skip-protocol]
BackPACK is a dev-only dependency: ``pip install --no-deps backpack-for-pytorch einops unfoldNd``.
curvlinops (optional, for its ``GGNDiagonalLinearOperator`` row on every model): a snapshot of its
``main`` (the 3.0.1 release has no diagonal operator) on ``PYTHONPATH`` or installed with
``pip install --no-deps``, beside ``scipy tqdm einconv linear_operator opt_einsum``.
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

from curvature_floor import (
    DT,
    ResidualCNN,
    TransformerBlock,
    autograd_floor,
    floors,
    layer_gemm_floor,
    randomize_bn,
)
from fathom.curvature import exact_diagonals
from fathom.train.allocator import tune_cpu_allocator

CLOCK = {"clock": time.perf_counter}
EPOCHS = (0, 1, 5, 10, 20, 50, 100)


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
    n, out = x.shape[0], {"ggn": {}, "empirical_fisher": {}, "jacobian_gram": {}}
    for name, j in jac.items():
        jf, shape = j.reshape(n, 10, -1), j.shape[2:]
        ggn = torch.einsum("ick,icp->ikp", sqrt_h, jf).square().sum((0, 1))
        out["ggn"][name] = (ggn / n).reshape(shape)
        out["empirical_fisher"][name] = (
            torch.einsum("ic,icp->ip", resid, jf).square().sum(0) / n
        ).reshape(shape)
        out["jacobian_gram"][name] = (jf.square().sum((0, 1)) / n).reshape(shape)
    return out


def with_floor(med: dict[str, float]) -> dict[str, float]:
    """Add ``pullback floor`` = the fastest floor variant of the same rounds."""
    return {"pullback floor": min(v for k, v in med.items() if k.startswith("floor:")), **med}


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
    out["empirical_fisher"] = [p.sum_grad_squared / n for p in bp_model.parameters()]
    bp_model.zero_grad(set_to_none=True)
    logits = bp_model(x)
    with backpack(DiagGGNExact()):
        extend(nn.MSELoss(reduction="sum"))(logits, torch.zeros_like(logits)).backward()
    out["jacobian_gram"] = [p.diag_ggn_exact / (2 * n) for p in bp_model.parameters()]
    return out


CLO_GGN = "curvlinops GGNDiagonalLinearOperator (GGN only)"


def curvlinops_ggn_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """``() -> [diag per parameter]`` with curvlinops' ``GGNDiagonalLinearOperator`` (mean CE,
    the exact GGN: ``mc_samples=0``), or ``None`` where this curvlinops has none (releases up
    to 3.0.1; its ``main`` has it: install a snapshot with ``pip install --no-deps``).

    curvlinops vmaps its per-datum pullbacks over the batch, so the model sees one datum
    without a batch axis; the wrapper gives it one (BatchNorm2d and a mean over the sequence
    axis need it) — the same function of the datum."""
    try:
        from curvlinops import GGNDiagonalLinearOperator
    except ImportError:
        return None
    params = dict(model.named_parameters())
    datum_dims = x.dim() - 1

    def model_func(p: dict, xb: torch.Tensor) -> torch.Tensor:
        if xb.dim() == datum_dims:
            return functional_call(model, p, (xb.unsqueeze(0),)).squeeze(0)
        return functional_call(model, p, (xb,))

    def run() -> list[torch.Tensor]:
        op = GGNDiagonalLinearOperator(
            model_func,
            nn.CrossEntropyLoss(),
            params,
            [(x, y)],
            check_deterministic=False,
            num_data=x.shape[0],
        )
        return list(op._diagonal)

    return run


def curvlinops_rows(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ours: dict):
    """``({CLO_GGN: fn} or {}, a line: the max relative difference from fathom's GGN)``."""
    fn = curvlinops_ggn_fn(model, x, y)
    if fn is None:
        return {}, "curvlinops GGNDiagonalLinearOperator: not available in this curvlinops"
    names = [n for n, _ in model.named_parameters()]
    rel = max_rel([ours[n] for n in names], fn())
    return {CLO_GGN: fn}, f"max rel diff fathom GGN vs curvlinops GGN diagonal: {rel:.1e}"


def _clo_ratio(med: dict[str, float]) -> str:
    if CLO_GGN not in med:
        return ""
    return f"fathom GGN / curvlinops GGN: {med[GGN] / med[CLO_GGN]:.3g}x (goal <= 1); "


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
    clock = CLOCK["clock"]
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = clock()
            fn()
            times[k].append(clock() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def report(title: str, med: dict[str, float], base: str, extra: list[str]) -> None:
    print(f"## {title}")
    for k, v in med.items():
        print(f"{k:<42}: {v * 1e3:9.1f} ms   ({v / med[base]:.2f}x {base})")
    for line in extra:
        print(line)


def check_floor(model: nn.Module, x: torch.Tensor) -> float:
    """The GEMM floor computes the same summed gradients as autograd (max relative diff)."""
    want = autograd_floor(model, x, False)
    got = layer_gemm_floor(model, x)
    return max(
        float((got[id(p)] - w).abs().max() / w.abs().max().clamp_min(1e-300))
        for p, w in zip(model.parameters(), want, strict=True)
    )


def fathom_rows(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    return {
        "fathom exact_diagonals (GGN+EF+Jac)": lambda: exact_diagonals(model, x, y),
        "fathom exact_diagonals (GGN only)": lambda: exact_diagonals(model, x, y, families="ggn"),
    }


ALL, GGN = "fathom exact_diagonals (GGN+EF+Jac)", "fathom exact_diagonals (GGN only)"
BP_GGN, BP_THREE = "BackPACK DiagGGNExact (GGN only)", "BackPACK three passes (GGN+EF+Jac)"


def bench_cnn(probe: int, repeats: int, side: int) -> None:
    from backpack import extend

    torch.manual_seed(0)
    model = randomize_bn(ResidualCNN(side=side)).to(DT).eval()
    x = torch.randn(probe, 1, side, side, dtype=DT)
    y = torch.randint(0, 10, (probe,))
    bp_model = extend(randomize_bn(ResidualCNN(side=side)).to(DT).eval(), use_converter=True)
    bp_model.load_state_dict(model.state_dict())
    ours = exact_diagonals(model, x, y)
    ggn_only = exact_diagonals(model, x, y, families="ggn")
    names = [n for n, _ in model.named_parameters()]
    rel_ggn = max_rel([ggn_only["ggn"][n] for n in names], backpack_ggn(bp_model, x, y))
    three = backpack_three(bp_model, x, y)
    rel3 = {k: max_rel([ours[k][n] for n in names], three[k]) for k in three}
    sub = slice(0, min(probe, 16))
    naive = naive_diagonals(model, x[sub], y[sub])
    small = exact_diagonals(model, x[sub], y[sub])
    rel_naive = max(
        max_rel([small[k][n] for n in names], [naive[k][n] for n in names]) for k in naive
    )
    clo, clo_line = curvlinops_rows(model, x, y, ggn_only["ggn"])
    params = sum(p.numel() for p in model.parameters())
    med = with_floor(
        interleaved(
            {
                **floors(model, x),
                **fathom_rows(model, x, y),
                BP_GGN: lambda: backpack_ggn(bp_model, x, y),
                BP_THREE: lambda: backpack_three(bp_model, x, y),
                **clo,
                "naive vmap(jacrev) (GGN+EF+Jac)": lambda: naive_diagonals(model, x, y),
            },
            repeats,
        )
    )
    base = "pullback floor"
    report(
        f"residual CNN with BatchNorm (eval), {params:,} params, 1x{side}x{side}, N={probe}, C=10, float64",
        med,
        base,
        [
            _clo_ratio(med) + f"BackPACK GGN / fathom GGN: {med[BP_GGN] / med[GGN]:.2f}x; "
            f"BackPACK three / fathom all: {med[BP_THREE] / med[ALL]:.2f}x; "
            f"fathom GGN / floor: {med[GGN] / med[base]:.2f}x; "
            f"fathom all / floor: {med[ALL] / med[base]:.2f}x",
            f"max rel diff vs BackPACK: GGN only {rel_ggn:.1e}; "
            + ", ".join(f"{k} {v:.1e}" for k, v in rel3.items())
            + f"; vs naive vmap (N={sub.stop}): {rel_naive:.1e}; "
            f"GEMM floor vs autograd gradients: {check_floor(model, x):.1e}",
            clo_line,
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
    ggn = exact_diagonals(model, x[sub], y[sub], families="ggn")["ggn"]
    rel = max(rel, max_rel(list(ggn.values()), list(naive["ggn"].values())))
    clo, clo_line = curvlinops_rows(
        model, x, y, exact_diagonals(model, x, y, families="ggn")["ggn"]
    )
    params = sum(p.numel() for p in model.parameters())
    med = with_floor(
        interleaved(
            {
                **floors(model, x),
                **fathom_rows(model, x, y),
                **clo,
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
        [
            refusal,
            f"max rel diff fathom (all; GGN only) vs naive vmap (N={sub.stop}): {rel:.1e}",
            _clo_ratio(med) + clo_line,
        ],
    )


def bench_mlp(probe: int, repeats: int, width_mult: float) -> None:
    import itertools

    from backpack import extend

    from fathom.models.ciresan import FULL_WIDTHS
    from fathom.models.specs import scaled_widths

    dims = (784, *scaled_widths(FULL_WIDTHS, width_mult))
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.ReLU()]
    torch.manual_seed(0)
    model = nn.Sequential(*layers, nn.Linear(dims[-1], 10)).to(DT)
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
    clo, clo_line = curvlinops_rows(
        model, x, y, exact_diagonals(model, x, y, families="ggn")["ggn"]
    )
    med = with_floor(
        interleaved(
            {
                **floors(model, x),
                **fathom_rows(model, x, y),
                BP_GGN: lambda: backpack_ggn(bp_model, x, y),
                BP_THREE: lambda: backpack_three(bp_model, x, y),
                **clo,
            },
            repeats,
        )
    )
    params = sum(p.numel() for p in model.parameters())
    report(
        f"plain MLP {'-'.join(map(str, dims))}-10, {params:,} params, N={probe}",
        med,
        "pullback floor",
        [
            _clo_ratio(med)
            + f"BackPACK GGN / fathom GGN: {med[BP_GGN] / med[GGN]:.2f}x; "
            + clo_line
        ],
    )


def bench_protocol(probe: int) -> None:
    from fathom.base.io import atomic_write_json
    from fathom.config import ModelConfig, RunConfig
    from fathom.curvature.rundir import run_curvature
    from fathom.data.splits import DataSplits
    from fathom.models import build_model
    from fathom.rundir import RunDir
    from fathom.rundir.files import save_weights
    from fathom.rundir.weights import cpu_state

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
            model = build_model(cfg.model, dataset=cfg.data.dataset)
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
    ap.add_argument("--probe", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: thread CPU clock)"
    )
    ap.add_argument("--side", type=int, default=16, help="CNN image side (multiple of 4)")
    ap.add_argument("--mlp-width-mult", type=float, default=0.25)
    ap.add_argument("--skip-mlp", action="store_true")
    ap.add_argument("--skip-protocol", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    CLOCK["clock"] = time.thread_time if args.threads == 1 else time.perf_counter
    tuned = tune_cpu_allocator()
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}; "
        f"clock {CLOCK['clock'].__name__}; allocator tuned: {tuned}; "
        f"load average at start {' '.join(f'{v:.2f}' for v in os.getloadavg())}; "
        f"repeats {args.repeats} (interleaved), medians"
    )
    bench_cnn(args.probe, args.repeats, args.side)
    bench_transformer(args.probe, args.repeats)
    if not args.skip_mlp:
        bench_mlp(128, args.repeats, args.mlp_width_mult)
    if not args.skip_protocol:
        bench_protocol(128)
    print(f"load average at end {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
