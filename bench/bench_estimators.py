"""Curvature estimators when exact is unaffordable: cost and memory against exact and BackPACK.

Three parts, float64, each configuration in its **own subprocess** so that its peak resident
memory (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, the whole process: Python, torch,
the model and the estimator) is its own:

* ``resnet``: a ResNet-18-like CNN (:func:`resnet18`, CIFAR-style 3x3 stem, four stages of
  two basic blocks, 11.7 M parameters with a 1000-class head) at 32x32, ``C = 1000``,
  ``N = 32``: ``fathom.curvature.diagonals(estimator="auto", budget=Budget(memory="4GB"))``
  and what it chose, wall time and peak RSS (the goal: within 4 GB);
* ``classes``: the plain MLP (784-1000-500-250-C, ~1.1 M parameters, N = 32) at
  ``C = 10, 100, 1000``: exact GGN diagonal against MC (K samples), the second (warm) call
  timed (the first builds the float64 twin and its seam; median of 3 warm calls), each
  against one float64 gradient (forward + backward of the mean CE, median of 5) measured in
  the same subprocess; one torch thread and the thread's CPU clock (``time.thread_time``),
  so other jobs on a shared machine do not enter;
* ``backpack``: MC (with standard errors, the default, and ``standard_errors=False``)
  against BackPACK's ``DiagGGNMC`` at equal samples, ``C = 10``, ``N = 32``, on that MLP,
  the residual CNN with BatchNorm (eval) of ``curvature_floor.py`` (BackPACK through
  ``extend(..., use_converter=True)``), its transformer block (embedding, attention,
  LayerNorm, mean-pooled) and that block token-level (a per-token head, ``[N, T, V]`` with
  V = 100, ``loss="cross_entropy", class_dim=-1``; BackPACK's refusals are printed), each
  against one float64 gradient;
  all in one process, interleaved rounds, one torch thread, thread CPU time, medians
  (BackPACK is a dev-only dependency:
  ``pip install --no-deps backpack-for-pytorch einops unfoldNd``);
* ``hutchinson``: ``diagonals(estimator="hutchinson", samples=K)`` with its probes batched
  (up to ``_PROBES_PER_PASS`` per pass, the default; ``--probes`` sets other pass sizes)
  against the one-probe-at-a-time estimator (``_PROBES_PER_PASS = 1``: a forward and a
  double-vjp per probe), side by side on the MLP (C = 10), the residual CNN, the transformer
  block and the token-level block of ``backpack`` (N = 32) and on the test suite's 5-7-4 MLP
  (N = 6), each against one float64 gradient; the largest difference of the two estimates
  (relative to each parameter's largest entry) is printed beside the times. All in one
  process, interleaved rounds, one torch thread, thread CPU time, medians.

Usage: python bench/bench_estimators.py [--part resnet|classes|backpack|hutchinson|all]
       [--repeats 3] [--samples 2] [--probes 8,16,32,64]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

DT = torch.float64


# -- models ------------------------------------------------------------------------------------
class Block(nn.Module):
    """A ResNet basic block: ``relu(bn(conv(relu(bn(conv(h))))) + shortcut(h))``."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        short = stride != 1 or cin != cout
        self.short = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if short
            else nn.Identity()
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(h))))) + self.short(h))


def resnet18(classes: int = 1000) -> nn.Module:
    """ResNet-18 for 32x32 inputs (3x3 stem, no max pool), average-pooled into a linear head."""
    widths, layers, cin = (64, 128, 256, 512), [], 64
    for i, w in enumerate(widths):
        layers += [Block(cin, w, 1 if i == 0 else 2), Block(w, w, 1)]
        cin = w
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, 1, 1, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        *layers,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(512, classes),
    )


def mlp(classes: int) -> nn.Module:
    """784-1000-500-250-C with ReLU (1.1 M parameters at C = 10)."""
    dims = (784, 1000, 500, 250)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(dims[-1], classes))


# -- one measurement per subprocess -----------------------------------------------------------
def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def gradient_s(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Median of 5 float64 gradients of the mean CE (forward + backward), thread CPU time."""
    m = model.to(DT)
    times = []
    for _ in range(5):
        t0 = time.thread_time()
        m.zero_grad()
        F.cross_entropy(m(x.to(DT)), y).backward()
        times.append(time.thread_time() - t0)
    return statistics.median(times)


def child(spec: dict) -> dict:
    from fathom.curvature import Budget, diagonals

    torch.manual_seed(0)
    if spec["model"] == "resnet":
        model = resnet18(spec["classes"]).eval()
        x = torch.randn(spec["n"], 3, 32, 32)
    else:
        model = mlp(spec["classes"])
        x = torch.rand(spec["n"], 784)
    y = torch.randint(0, spec["classes"], (spec["n"],))
    base_rss = peak_rss_mib()

    def call():
        return diagonals(
            model,
            x,
            y,
            estimator=spec["estimator"],
            samples=spec["samples"],
            budget=Budget(memory=spec["budget"]),
        )

    t0 = time.perf_counter()
    est = call()  # the first call builds the float64 twin and its seam (cached per model)
    first = time.perf_counter() - t0
    if spec.get("warm"):  # median of 3 warm calls, thread CPU time (one torch thread)
        times = []
        for _ in range(3):
            t0 = time.thread_time()
            est = call()
            times.append(time.thread_time() - t0)
        wall = statistics.median(times)
    else:
        wall = first
    out = {
        **spec,
        "first_call_s": first,
        "wall_s": wall,
        "peak_rss_mib": peak_rss_mib(),
        "rss_before_mib": base_rss,
        "choice": est.choice,
        "estimators": est.estimators,
        "layout": est.layout,
        "ggn_trace": est.traces["ggn"],
        "ggn_trace_se": est.trace_standard_errors["ggn"],
    }
    if spec.get("gradient"):
        out["gradient_s"] = gradient_s(model, x, y)
    return out


def run_child(spec: dict) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps(spec)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {**spec, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- parts ------------------------------------------------------------------------------------
def part_resnet(samples: int) -> None:
    r = run_child(
        {
            "model": "resnet",
            "classes": 1000,
            "n": 32,
            "estimator": "auto",
            "samples": samples,
            "budget": "4GB",
        }
    )
    print("resnet-18-like 32x32, C=1000, N=32, auto, budget 4 GB:")
    print(json.dumps(r, indent=1))


def part_classes(samples: int) -> None:
    print(f"MLP 784-1000-500-250-C, N=32, float64; MC K={samples}; each in its own process")
    print("| C | estimator | warm call CPU s | x gradient | peak RSS MiB | trace (SE) |")
    print("|---|---|---|---|---|---|")
    for c in (10, 100, 1000):
        for est in ("exact", "mc"):
            r = run_child(
                {
                    "model": "mlp",
                    "classes": c,
                    "n": 32,
                    "estimator": est,
                    "samples": samples,
                    "budget": "64GB",
                    "gradient": True,
                    "warm": True,
                    "threads": 1,
                }
            )
            if "error" in r:
                print(f"| {c} | {est} | error {r['error']} |")
                continue
            se = r["ggn_trace_se"]
            print(
                f"| {c} | {est} | {r['wall_s']:.3f} | {r['wall_s'] / r['gradient_s']:.1f} | "
                f"{r['peak_rss_mib']:.0f} | {r['ggn_trace']:.4g}"
                + (f" ({se:.2g})" if se is not None else "")
                + " |"
            )


def _token_transformer():
    from curvature_floor import TransformerBlock

    class TokenTransformer(TransformerBlock):
        """``curvature_floor``'s block with a per-token head: ``[N, T, V]`` logits."""

        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Linear(32, 100)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            h = self.embed(tokens) + self.pos
            a = self.ln1(h)
            h = h + self.attn(a, a, a, need_weights=False)[0]
            return self.head(h + self.mlp(self.ln2(h)))

    return TokenTransformer


def _backpack_models() -> list[tuple]:
    """``(label, model, x, y, BackPACK-extended copy or None, diagonals' loss arguments)`` for
    the four models, float64: the MLP, the residual CNN and the transformer block of
    ``curvature_floor.py`` (as ``bench_curvature.py``), and that block with a per-token head
    (``[N, T, V]``, V = 100, cross-entropy over every token: ``class_dim=-1``)."""
    from backpack import extend

    from curvature_floor import ResidualCNN, TransformerBlock, randomize_bn

    torch.manual_seed(0)
    out = []
    model = mlp(10).to(DT)
    bp = extend(mlp(10).to(DT))
    bp.load_state_dict(model.state_dict())
    out.append(
        (
            "MLP 784-1000-500-250-10",
            model,
            torch.rand(32, 784, dtype=DT),
            torch.randint(0, 10, (32,)),
            bp,
            {},
        )
    )
    model = randomize_bn(ResidualCNN(side=16)).to(DT).eval()
    bp = extend(randomize_bn(ResidualCNN(side=16)).to(DT).eval(), use_converter=True)
    bp.load_state_dict(model.state_dict())
    x = torch.randn(32, 1, 16, 16, dtype=DT)
    y = torch.randint(0, 10, (32,))
    out.append(("residual CNN (BatchNorm eval) 1x16x16", model, x, y, bp, {}))
    model = TransformerBlock().to(DT).eval()
    out.append(
        (
            "transformer block (tokens, attention, LayerNorm)",
            model,
            torch.randint(0, 100, (32, 16)),
            torch.randint(0, 10, (32,)),
            None,
            {},
        )
    )
    tokens = torch.randint(0, 100, (32, 16))
    model = _token_transformer()().to(DT).eval()
    out.append(
        (
            "token-level transformer ([N, T, V] = [32, 16, 100])",
            model,
            tokens,
            torch.randint(0, 100, (32, 16)),
            None,
            {"loss": "cross_entropy", "class_dim": -1},
        )
    )
    return out


def _interleaved(fns: dict, repeats: int) -> dict[str, float]:
    """Median seconds of this thread's CPU clock per call of each of ``fns``, after one
    warm-up call each (fathom: the twin and its seam are built once per model), the calls
    interleaved over ``repeats`` rounds."""
    for f in fns.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.thread_time()
            f()
            times[k].append(time.thread_time() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy over examples (and tokens: ``[N, T, V]`` read as torch's
    ``[N, V, T]``)."""
    return F.cross_entropy(out.transpose(1, 2) if out.dim() == 3 else out, y)


def part_backpack(samples: int, repeats: int) -> None:
    try:
        from backpack import backpack, extend
        from backpack.extensions import DiagGGNMC
    except ImportError:
        print(
            "BackPACK is not installed: pip install --no-deps backpack-for-pytorch einops unfoldNd"
        )
        return
    from fathom.curvature import diagonals

    torch.set_num_threads(1)  # thread CPU clock below: other jobs on the machine do not enter
    lossf = extend(nn.CrossEntropyLoss())
    for label, model, x, y, bp_model, kw in _backpack_models():
        fns = {
            "fathom mc": lambda m=model, x=x, y=y, kw=kw: diagonals(
                m, x, y, estimator="mc", samples=samples, **kw
            ),
            "fathom mc, no SE": lambda m=model, x=x, y=y, kw=kw: diagonals(
                m, x, y, estimator="mc", samples=samples, standard_errors=False, **kw
            ),
        }
        refusal = ""
        if bp_model is None:
            try:
                bp_try = extend(type(model)().to(DT).eval(), use_converter=True)
                with backpack(DiagGGNMC(mc_samples=samples)):
                    out = bp_try(x)
                    lossf(out.transpose(1, 2) if out.dim() == 3 else out, y).backward()
                refusal = "BackPACK ran (unexpected)"
            except Exception as err:  # what BackPACK says about this model
                refusal = (
                    f"BackPACK refuses: {type(err).__name__}: {str(err).splitlines()[0][:100]}"
                )
        else:

            def theirs(bp_model=bp_model, x=x, y=y) -> None:
                bp_model.zero_grad()
                with backpack(DiagGGNMC(mc_samples=samples)):
                    lossf(bp_model(x), y).backward()

            fns["backpack DiagGGNMC"] = theirs

        def grad(model=model, x=x, y=y) -> None:
            model.zero_grad()
            _ce(model(x), y).backward()

        fns["gradient"] = grad
        med = _interleaved(fns, repeats)
        params = sum(p.numel() for p in model.parameters())
        print(
            f"{label}, {params:,} params, N=32 float64, K={samples}, {repeats} interleaved "
            f"rounds, one thread, thread CPU time, medians (s), load {os.getloadavg()[0]:.1f}:"
        )
        for k, v in med.items():
            print(f"  {k:<22} {v:.4f}  ({v / med['gradient']:.1f}x gradient)")
        if "backpack DiagGGNMC" in med:
            bp = med["backpack DiagGGNMC"]
            print(
                f"  fathom / BackPACK: {med['fathom mc'] / bp:.2f} "
                f"(no SE: {med['fathom mc, no SE'] / bp:.2f})"
            )
        else:
            print(f"  {refusal}")


def _hutchinson_models() -> list[tuple]:
    """``(label, model, x, y, loss arguments)``: :func:`_backpack_models`' four (BackPACK not
    needed) and the test suite's 5-7-4 MLP on 6 examples."""
    from curvature_floor import ResidualCNN, TransformerBlock, randomize_bn

    torch.manual_seed(0)
    tiny = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 4)).to(DT)
    return [
        ("MLP 784-1000-500-250-10, N=32", mlp(10).to(DT), torch.rand(32, 784, dtype=DT),
         torch.randint(0, 10, (32,)), {}),
        ("residual CNN (BatchNorm eval) 1x16x16, N=32",
         randomize_bn(ResidualCNN(side=16)).to(DT).eval(), torch.randn(32, 1, 16, 16, dtype=DT),
         torch.randint(0, 10, (32,)), {}),
        ("transformer block, N=32", TransformerBlock().to(DT).eval(),
         torch.randint(0, 100, (32, 16)), torch.randint(0, 10, (32,)), {}),
        ("token-level transformer [32, 16, 100]", _token_transformer()().to(DT).eval(),
         torch.randint(0, 100, (32, 16)), torch.randint(0, 100, (32, 16)),
         {"loss": "cross_entropy", "class_dim": -1}),
        ("test-suite MLP 5-7-4, N=6", tiny, torch.randn(6, 5, dtype=DT),
         torch.randint(0, 4, (6,)), {}),
    ]  # fmt: skip


def part_hutchinson(samples: int, repeats: int, probes: list[int]) -> None:
    import fathom.curvature.estimate as estimate
    from fathom.curvature import diagonals

    torch.set_num_threads(1)  # thread CPU clock below: other jobs on the machine do not enter
    default = estimate._PROBES_PER_PASS
    sizes = [1, *sorted(set(probes) - {1})] if probes else [1, default]
    for label, model, x, y, kw in _hutchinson_models():
        ests: dict[int, object] = {}

        def call(b: int, model=model, x=x, y=y, kw=kw, ests=ests) -> None:
            estimate._PROBES_PER_PASS = b
            try:
                ests[b] = diagonals(
                    model, x, y, estimator="hutchinson", samples=samples, seed=0, **kw
                )
            finally:
                estimate._PROBES_PER_PASS = default

        def grad(model=model, x=x, y=y) -> None:
            model.zero_grad()
            _ce(model(x), y).backward()

        fns = {**{f"probes per pass {b}": partial(call, b) for b in sizes}, "gradient": grad}
        med = _interleaved(fns, repeats)
        params = sum(p.numel() for p in model.parameters())
        print(
            f"{label}, {params:,} params, float64, K={samples}, {repeats} interleaved rounds, "
            f"one thread, thread CPU time, medians (s), load {os.getloadavg()[0]:.1f}:"
        )
        looped = med["probes per pass 1"]
        for b in sizes:
            e, ref = ests[b], ests[1]
            worst = max(
                float((e.diagonals["ggn"][p] - v).abs().max() / v.abs().max().clamp_min(1e-300))
                for p, v in ref.diagonals["ggn"].items()
            )
            k = f"probes per pass {b}"
            print(
                f"  {k:<20} {med[k]:.4f}  ({med[k] / med['gradient']:.1f}x gradient, looped / "
                f"this {looped / med[k]:.2f}; layout {e.layout['examples_per_chunk']} examples x "
                f"{e.layout.get('probes_per_chunk')} probes, batched {e.layout.get('batched')}; "
                f"max rel diff to looped {worst:.1e})"
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--part", default="all")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--probes", default="", help="hutchinson: pass sizes, e.g. 8,16,32,64")
    args = ap.parse_args()
    if args.child:
        spec = json.loads(args.child)
        torch.set_num_threads(spec.get("threads", 2))
        print(json.dumps(child(spec)))
        return
    print(
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    if args.part in ("resnet", "all"):
        part_resnet(args.samples)
    if args.part in ("classes", "all"):
        part_classes(args.samples)
    if args.part in ("backpack", "all"):
        part_backpack(args.samples, args.repeats)
    if args.part in ("hutchinson", "all"):
        probes = [int(b) for b in args.probes.split(",") if b]
        part_hutchinson(args.samples, args.repeats, probes)


if __name__ == "__main__":
    main()
