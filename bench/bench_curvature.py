"""Exact CE-GGN diagonal: fathom.curvature versus BackPACK ``DiagGGNExact``, and the 21-snapshot protocol.

Part 1, same plain MLP (Linear/ReLU ``nn.Sequential``, Ciresan widths times ``--width-mult``),
same float64 probe of ``--probe`` examples, timings interleaved over ``--repeats``:

* fathom:   ``fathom.curvature.exact_ggn_diagonal`` (one forward, one batched backward of the
            C square-root directions, one matmul per layer for the diagonal);
* BackPACK: ``DiagGGNExact`` on the mean CE (forward, ``loss.backward()`` in its context);
* train step: one plain float64 SGD step (forward, backward, update) on the same batch, for scale.

Reported: medians, ratios, and the maximum relative difference of the two diagonals
(``max |fathom - backpack| / max |backpack|`` over each parameter, worst parameter).
Then the three diagonals a snapshot needs (GGN, empirical Fisher, Jacobian Gram): fathom's
single pullback of the C unit directions versus BackPACK's DiagGGNExact + SumGradSquared on
CE and DiagGGNExact on a summed MSE (logit Hessian 2I), normalized alike.

Part 2: wall time of ``run_curvature`` over 7 checkpoints (0 1 5 10 20 50 100) of 3 run
directories (21 snapshots), given with ``--runs`` (real runs) or synthesized (the same tiny
model saved 7 times per run, synthetic uint8 probe; stated in the output).

Usage: python bench/bench_curvature.py [--width-mult 1.0] [--probe 128] [--repeats 5] [--runs DIR...]
       [--device cuda] [--threads 2] [--skip-protocol]
BackPACK is a dev-only dependency: ``pip install --no-deps backpack-for-pytorch einops unfoldNd``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from fathom.curvature import affine_chain, exact_ggn_diagonal, pullback
from fathom.curvature.exact import directions_from_jacobian_rows, layer_diagonals, unit_directions
from fathom.curvature.rundir import run_curvature
from fathom.curvature.softmax import softmax_parts
from fathom.models.ciresan import FULL_WIDTHS, scaled_widths

EPOCHS = (0, 1, 5, 10, 20, 50, 100)


def plain_mlp(widths: tuple[int, ...], classes: int = 10, in_features: int = 784) -> nn.Sequential:
    dims = (in_features, *widths)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(dims[-1], classes))
    return nn.Sequential(*layers)


def backpack_diag(model: nn.Sequential, loss_fn: nn.Module, x: torch.Tensor, y: torch.Tensor):
    from backpack import backpack
    from backpack.extensions import DiagGGNExact

    model.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    with backpack(DiagGGNExact()):
        loss.backward()
    return [p.diag_ggn_exact for p in model.parameters()]


def backpack_three(model: nn.Sequential, ce_sum: nn.Module, mse_sum: nn.Module, x, y):
    """GGN, empirical Fisher, Jacobian Gram diagonals with BackPACK: three passes, fathom's normalization.

    GGN: DiagGGNExact on the mean CE. Empirical Fisher: SumGradSquared on the summed CE, / N.
    Jacobian Gram: DiagGGNExact on the summed MSE (logit Hessian 2I), / 2N.
    """
    from backpack import backpack
    from backpack.extensions import DiagGGNExact, SumGradSquared

    n = x.shape[0]
    out = {}
    model.zero_grad(set_to_none=True)
    logits = model(x)
    with backpack(DiagGGNExact(), SumGradSquared()):
        ce_sum(logits, y).backward()
    out["ggn"] = [p.diag_ggn_exact / n for p in model.parameters()]
    out["fisher"] = [p.sum_grad_squared / n for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    logits = model(x)
    with backpack(DiagGGNExact()):
        mse_sum(logits, torch.zeros_like(logits)).backward()
    out["jacobian"] = [p.diag_ggn_exact / (2 * n) for p in model.parameters()]
    return out


def fathom_three(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor):
    """The same three diagonals from one pullback of the C unit logit directions."""
    chain = affine_chain(model)
    pb = pullback(chain, x, unit_directions)
    parts = softmax_parts(pb.logits)
    out = {"ggn": [], "fisher": [], "jacobian": []}
    for j, a in zip(pb.directions, pb.inputs, strict=True):
        d = layer_diagonals(directions_from_jacobian_rows(j, parts, y), a, has_bias=True)
        out["ggn"] += [d.ggn_w, d.ggn_b]
        out["fisher"] += [d.fisher_w, d.fisher_b]
        out["jacobian"] += [d.jacobian_w, d.jacobian_b]
    return out


def max_rel(ours: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    """Worst parameter's ``max |ours - ref| / max |ref|``."""
    return max(
        float((a - b).abs().max()) / float(b.abs().max())
        for a, b in zip(ours, ref, strict=True)
        if float(b.abs().max()) > 0
    )


def fathom_diag(model: nn.Sequential, x: torch.Tensor) -> list[torch.Tensor]:
    out = []
    for w, b in exact_ggn_diagonal(model, x):
        out += [w, b]
    return out


def train_step(
    model: nn.Sequential, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> None:
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def timed(fn, device: torch.device) -> float:
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()  # note: a CPU-GPU sync point, outside the timed work
    return time.perf_counter() - t0


def bench_diag(width_mult: float, probe: int, repeats: int, device: torch.device) -> None:
    from backpack import extend

    torch.manual_seed(0)
    widths = scaled_widths(FULL_WIDTHS, width_mult)
    model = plain_mlp(widths).to(device, torch.float64)
    x = torch.rand(probe, 784, dtype=torch.float64, device=device)
    y = torch.randint(0, 10, (probe,), device=device)
    bp_model = extend(plain_mlp(widths).to(device, torch.float64))
    bp_model.load_state_dict(model.state_dict())
    loss_fn = extend(nn.CrossEntropyLoss(reduction="mean"))
    step_model = plain_mlp(widths).to(device, torch.float64)
    step_model.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(step_model.parameters(), lr=1e-6)

    ce_sum = extend(nn.CrossEntropyLoss(reduction="sum"))
    mse_sum = extend(nn.MSELoss(reduction="sum"))
    rel = max_rel(fathom_diag(model, x), backpack_diag(bp_model, loss_fn, x, y))  # warm-up + check
    ours3, ref3 = fathom_three(model, x, y), backpack_three(bp_model, ce_sum, mse_sum, x, y)
    rel3 = {k: max_rel(ours3[k], ref3[k]) for k in ours3}
    t_ours, t_bp, t_step, t_ours3, t_bp3 = [], [], [], [], []
    for _ in range(repeats):
        t_ours.append(timed(lambda: fathom_diag(model, x), device))
        t_bp.append(timed(lambda: backpack_diag(bp_model, loss_fn, x, y), device))
        t_step.append(timed(lambda: train_step(step_model, opt, x, y), device))
        t_ours3.append(timed(lambda: fathom_three(model, x, y), device))
        t_bp3.append(timed(lambda: backpack_three(bp_model, ce_sum, mse_sum, x, y), device))
    m_ours, m_bp, m_step, m_ours3, m_bp3 = (
        statistics.median(t) for t in (t_ours, t_bp, t_step, t_ours3, t_bp3)
    )
    params = sum(p.numel() for p in model.parameters())
    print(
        f"## exact GGN diagonal, plain MLP 784-{'-'.join(map(str, widths))}-10 ({params:,} params)"
    )
    print(f"float64 on {device}, probe N={probe}, C=10, repeats={repeats} (interleaved), medians")
    print(f"fathom exact_ggn_diagonal : {m_ours * 1e3:9.1f} ms")
    print(f"BackPACK DiagGGNExact     : {m_bp * 1e3:9.1f} ms")
    print(f"plain float64 SGD step    : {m_step * 1e3:9.1f} ms")
    print(f"speed-up BackPACK / fathom: {m_bp / m_ours:.2f}x")
    print(
        f"fathom / train step       : {m_ours / m_step:.2f}x;  BackPACK / train step: {m_bp / m_step:.2f}x"
    )
    print(f"max relative difference   : {rel:.2e}")
    print("-- GGN + empirical Fisher + Jacobian Gram diagonals (what a snapshot needs) --")
    print(f"fathom, one pullback      : {m_ours3 * 1e3:9.1f} ms")
    print(f"BackPACK, three passes    : {m_bp3 * 1e3:9.1f} ms")
    print(f"speed-up BackPACK / fathom: {m_bp3 / m_ours3:.2f}x")
    print("max relative differences  : " + ", ".join(f"{k} {v:.2e}" for k, v in rel3.items()))


def synthesize_runs(root: Path) -> list:
    """Three tiny run directories, each the same model saved at the 7 protocol epochs."""
    from fathom.config import ModelConfig, RunConfig
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

    runs = []
    for recipe in ("residual", "sd_constant", "sd_decreasing"):
        cfg = RunConfig(name=recipe, model=ModelConfig(recipe=recipe, width_mult=0.04))
        torch.manual_seed(101)
        model = build_model(cfg.model)
        ckpts = {}
        for e in EPOCHS:
            rel = f"checkpoints/epoch-{e:04d}.safetensors"
            ckpts[str(e)] = {
                "file": rel,
                "params_sha256": save_weights(root / recipe / rel, cpu_state(model), {"epoch": e}),
            }
        atomic_write_json(
            root / recipe / "manifest.json",
            {
                "run_id": recipe,
                "config": cfg.model_dump(mode="json"),
                "checkpoints": ckpts,
                "data": {"info": {}},
            },
        )
        runs.append(SyntheticRunDir(root / recipe))
    return runs


def bench_protocol(run_paths: list[str] | None, probe: int) -> None:
    from fathom.rundir import RunDir

    with tempfile.TemporaryDirectory() as tmp:
        if run_paths:
            runs, origin = [RunDir(p) for p in run_paths], "real run directories"
        else:
            runs, origin = (
                synthesize_runs(Path(tmp)),
                "synthesized checkpoints (one tiny model saved 7x per run)",
            )
        t0 = time.perf_counter()
        per = []
        for rd in runs:
            rows = run_curvature(
                rd, list(EPOCHS), probe=probe, out_dir=Path(tmp) / "out" / rd.run_id
            )
            per += [r["runtime_s"] for r in rows]
        total = time.perf_counter() - t0
    model = runs[0].build_model()
    widths = "-".join(str(lin.out_features) for lin in model.affine_layers())
    print(f"## 21-snapshot protocol ({origin}), CiresanMLP 784-{widths}, probe N={probe}, float64")
    print(
        f"snapshots: {len(per)}; total wall {total:.2f} s (hash checks, loading, writing included)"
    )
    print(
        f"per snapshot: median {statistics.median(per) * 1e3:.1f} ms, max {max(per) * 1e3:.1f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width-mult", type=float, default=1.0)
    ap.add_argument("--probe", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--runs", nargs="*", help="three run directories with epochs 0 1 5 10 20 50 100"
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--skip-protocol", action="store_true", help="only the GGN-diagonal comparison")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "no GPU"
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch "
        f"threads, {gpu}, torch {torch.__version__}"
    )
    bench_diag(args.width_mult, args.probe, args.repeats, device)
    if not args.skip_protocol:
        bench_protocol(args.runs, args.probe)


if __name__ == "__main__":
    main()
