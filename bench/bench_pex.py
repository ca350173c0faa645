"""Per-example gradient moments on any model: Fathom vs BackPACK vs naive ``vmap``.

Part 1 — a residual CNN with BatchNorm in eval mode (CPU size: 3x32x32 inputs, a conv stem,
``--blocks`` residual blocks ``x + bn(conv(relu(bn(conv(x)))))`` at ``--width`` channels, 2x2
pooling, global average pooling, a linear head; batch ``--batch``), timed interleaved over
``--repeats`` rounds of ``--iters`` calls, medians of this thread's CPU clock
(``time.thread_time``):

* fathom:   ``fathom.Instruments(model, x, y, families=("moments",)).observe()`` — the dense
            forward with hooks, one ``autograd.grad`` to the layer outputs, per-example weight
            Gram matrices (for the convs a grouped convolution whose groups are the examples,
            or patches for the stem; torch's fused BatchNorm backward over ``N*C`` channels for
            the BatchNorm affines; the ``N x N`` Gram trick for the head), every moment and norm
            quantile of every layer in float64 (layer discovery done once before timing; its
            cold cost is printed separately);
* BackPACK: forward + backward under ``backpack(BatchL2Grad(), SumGradSquared(), Variance())``
            (``extend(model, use_converter=True)`` for the residual additions);
* vmap:     ``torch.func.vmap(grad)`` full per-example gradients, then the same Gram matrices
            and moments (``moments_from_grams``);
* step:     one SGD step (forward, backward, update) for scale;
* floor:    the dense forward with the layers' calls captured and the pullback of the summed
            loss to every layer output: the part of ``observe`` before any per-example work
            (any exact per-example method needs it; ``fathom - floor`` is what the
            per-example gradients, Grams and moments add);
* grads:    the floor, then every layer's per-example gradients by Fathom's kernels, with no
            Gram and no moments (``grads - floor`` is the per-example gradients,
            ``fathom - grads`` the Grams, moments and quantiles);
* bound:    the floor with the parameters added to the same pullback (``autograd.grad`` to the
            layer outputs and the parameters together): the floor plus every weight gradient
            once, the multiply-adds any exact per-example method adds at least (the batch
            gradient is the sum of the per-example ones), with no per-example split, no Gram
            and no moments.

fathom, vmap, floor and bound are each timed in two memory layouts: the model as given
(NCHW) and a channels-last copy of the model with a channels-last input (oneDNN then runs
the convolutions, BatchNorm and pooling in NHWC). A per-example method is held to the vmap of
the faster layout; the bound of each layout says what that layout leaves for the
per-example work.

Then one convolution of the first block (the largest per-example products) by every
stock-kernel route to per-example weight gradients (the grouped convolution Fathom uses, the
same on a channels-last input, unfold + ``bmm``, nine shifted ``bmm``, one weight gradient per
example in each layout) against the batch weight gradient and the forward convolution (the
same multiply-adds in torch's best kernels).

Consistency is checked: BackPACK's ``batch_l2`` (per-example squared norms of the *mean* loss,
``||g_i||^2 / N^2``) times ``N`` equals Fathom's ``mean_sq_norm`` for every conv and linear weight,
and every field of the channels-last copy is printed against the NCHW model's (relative).

Part 2 — a transformer block (Embedding, LayerNorm, ``nn.MultiheadAttention``, a position-wise
Linear), which BackPACK does not support (what it does is printed: an error, or the
parameters it silently left without ``batch_l2``): fathom vs vmap, the same way.

Usage: python bench/bench_pex.py [--batch 64] [--width 16] [--blocks 3] [--repeats 7] [--iters 3]
BackPACK is a dev-only dependency (``pip install --no-deps backpack-for-pytorch einops unfoldNd``).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import fathom
from fathom.telemetry.moments import moments_from_grams


class Residual(nn.Module):
    """``x + branch(x)``."""

    def __init__(self, branch: nn.Module) -> None:
        super().__init__()
        self.branch = branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.branch(x)


def residual_cnn(width: int, blocks: int, classes: int = 10) -> nn.Module:
    def block() -> nn.Module:
        return Residual(
            nn.Sequential(
                nn.Conv2d(width, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.Conv2d(width, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
            )
        )

    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
    for i in range(blocks):
        layers += [block(), nn.ReLU()]
        if i < 2:
            layers.append(nn.MaxPool2d(2))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes)]
    return nn.Sequential(*layers)


class TransformerBlock(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        a = self.ln1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + torch.relu(self.mlp(self.ln2(h)))
        return self.head(h.mean(dim=1))


def machine() -> str:
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {load}"
    )


def vmap_moments(model: nn.Module, x: torch.Tensor, y: torch.Tensor, layers) -> list:
    """Naive: full per-example gradients by ``vmap(grad)``, then per-layer Gram matrices."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        out = torch.func.functional_call(model, p, (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0), reduction="sum")

    g = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    grams = []
    for layer in layers:
        qual = dict(zip(layer.params, layer.qualified, strict=True))
        flat = torch.cat([g[qual[p]].reshape(len(y), -1) for p in layer.weights], 1).double()
        grams.append(flat @ flat.T)
    return moments_from_grams(torch.stack(grams))


def timed(variants: dict[str, Callable[[], object]], repeats: int, iters: int) -> dict[str, float]:
    for fn in variants.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            t0 = time.thread_time()  # this thread's CPU clock: other jobs do not enter
            for _ in range(iters):
                fn()
            times[name].append((time.thread_time() - t0) / iters)
    return {k: statistics.median(v) for k, v in times.items()}


def _table(med: dict[str, float], ref: str) -> None:
    print(f"| variant | median s | x {ref} |")
    print("|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.4f} | {v / med[ref]:.2f} |")


def _floor(ins) -> tuple[dict, dict]:
    """The part of ``observe`` before any per-example work: the dense forward with the
    layers' calls captured and the pullback of the summed loss to every layer output (what
    any exact per-example method needs first). Returns the calls and their cotangents."""
    from fathom.telemetry.instruments import read_only

    seam = ins.seam
    with read_only(ins.model), torch.enable_grad():
        with seam.capture() as calls:
            out = seam.forward(ins.x)
        return calls, seam.cotangents(calls, ins.terms.example_sum(out))


def _bound(ins) -> None:
    """The floor with the parameters in the same pullback (module docstring: ``bound``)."""
    from fathom.telemetry.instruments import read_only

    seam = ins.seam
    with read_only(ins.model), torch.enable_grad():
        with seam.capture() as calls:
            out = seam.forward(ins.x)
        leaves = [
            t for cs in calls.values() for c in cs for t in c.output_leaves() if t.requires_grad
        ]
        torch.autograd.grad(ins.terms.example_sum(out), leaves + list(ins.model.parameters()))


def _grads(ins) -> None:
    """The floor, then every layer's per-example gradients by Fathom's kernels (the grouped
    convolution for the convs, patches for the stem, torch's BatchNorm backward over ``N*C``
    channels, one row per example for the head): ``observe`` without its Grams and moments."""
    from fathom.seam.pex import per_example_grads

    calls, cots = _floor(ins)
    n = len(ins.y)
    for layer in ins.seam.layers:
        if calls[layer.name]:
            per_example_grads(layer, calls[layer.name], cots[layer.name], n)


def conv_kernels(batch: int, width: int, size: int, repeats: int) -> dict[str, float]:
    """Per-example weight gradients ``[N, C_out, C_in, 3, 3]`` of one 3x3 convolution
    (``batch`` examples, ``width`` channels in and out, ``size`` x ``size``, zero padding 1)
    by every stock-kernel route, against the batch weight gradient (the same multiply-adds
    summed over the examples) and the forward convolution, in both layouts; medians of the
    thread CPU clock. Each route is checked against the grouped one (rel 1e-4)."""
    from fathom.seam.pex_conv import _conv_weight_grads_chunked

    g = torch.Generator().manual_seed(2)
    n, c = batch, width
    x = torch.randn(n, c, size, size, generator=g)
    d = torch.randn(n, c, size, size, generator=g)
    conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
    w = conv.weight.detach()
    xc, dc = (t.contiguous(memory_format=torch.channels_last) for t in (x, d))
    conv_cl = copy.deepcopy(conv).to(memory_format=torch.channels_last)
    w_cl = conv_cl.weight.detach()

    def wgrad(dd, xx, ww) -> torch.Tensor:
        args = (None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False])
        return torch.ops.aten.convolution_backward(dd, xx, ww, *args)[1]

    def unfold_bmm() -> torch.Tensor:  # patches [N, C*9, P] then one bmm per 4 examples
        out = torch.empty(n, c, c * 9)
        for s in range(0, n, 4):
            u = F.unfold(x[s : s + 4], 3, padding=1)
            torch.bmm(d[s : s + 4].flatten(2), u.transpose(1, 2), out=out[s : s + 4])
        return out.view(n, c, c, 3, 3)

    def shifted_bmm() -> torch.Tensor:  # nine bmms on shifted views of the padded input
        wp, length = size + 2, size * (size + 2)
        xp = F.pad(x, (1, 1, 1, 2)).flatten(2)
        dp = F.pad(d, (0, 2)).flatten(2)
        out = torch.empty(3, 3, n, c, c)
        for kh in range(3):
            for kw in range(3):
                off = kh * wp + kw
                torch.bmm(dp, xp[:, :, off : off + length].transpose(1, 2), out=out[kh, kw])
        return out.permute(2, 3, 4, 0, 1)

    def loop(dd, xx, ww) -> torch.Tensor:  # one weight gradient per example
        return torch.stack([wgrad(dd[i : i + 1], xx[i : i + 1], ww) for i in range(n)])

    routes = {
        "grouped convolution, NCHW (Fathom's route)": lambda: _conv_weight_grads_chunked(
            conv, x, d, n, 1
        ),
        "grouped convolution, channels-last input (folded to NCHW)": lambda: (
            _conv_weight_grads_chunked(conv_cl, xc, dc, n, 1)
        ),
        "unfold + bmm, NCHW": unfold_bmm,
        "nine shifted bmms, NCHW": shifted_bmm,
        "one weight gradient per example, NCHW": lambda: loop(d, x, w),
        "one weight gradient per example, channels-last": lambda: loop(dc, xc, w_cl),
    }
    ref = routes["grouped convolution, NCHW (Fathom's route)"]().double()
    for name, fn in routes.items():
        err = (fn().double() - ref).abs().max() / ref.abs().max()
        assert err <= 1e-4, (name, float(err))
    scale = {
        "batch weight gradient (summed over examples), NCHW": lambda: wgrad(d, x, w),
        "batch weight gradient, channels-last": lambda: wgrad(dc, xc, w_cl),
        "forward convolution, NCHW": lambda: F.conv2d(x, w, padding=1),
        "forward convolution, channels-last": lambda: F.conv2d(xc, w_cl, padding=1),
    }
    return timed({**routes, **scale}, repeats, 1)


def _instruments(model, x, y):
    t0 = time.perf_counter()
    ins = fathom.Instruments(model, x, y, families=("moments",))
    ins.observe()
    return ins, time.perf_counter() - t0


def part1(batch: int, width: int, blocks: int, repeats: int, iters: int) -> None:
    from backpack import backpack, extend
    from backpack.extensions import BatchL2Grad, SumGradSquared, Variance

    warnings.filterwarnings("ignore")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    torch.manual_seed(0)
    model = residual_cnn(width, blocks)
    F.cross_entropy(model(x), y)  # (eval below; running statistics stay at their defaults)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    model.eval()
    ins, cold = _instruments(model, x, y)
    bp_model = extend(residual_cnn(width, blocks), use_converter=True)
    bp_model.load_state_dict(model.state_dict())
    bp_model.eval()
    bp_loss = extend(nn.CrossEntropyLoss())
    step_model = residual_cnn(width, blocks)
    opt = torch.optim.SGD(step_model.parameters(), lr=1e-3, momentum=0.9)

    def bp() -> None:
        bp_model.zero_grad(set_to_none=True)
        with backpack(BatchL2Grad(), SumGradSquared(), Variance()):
            bp_loss(bp_model(x), y).backward()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(step_model(x), y).backward()
        opt.step()

    row = ins.observe()
    bp()
    bp_params = dict(bp_model.named_parameters())
    checked = 0
    for layer in ins.layers:
        if layer.kind in ("conv2d", "linear"):
            theirs = float(bp_params[layer.qualified[0]].batch_l2.double().sum()) * batch
            ours = row[f"grad/pex/mean_sq_norm/{layer.name}"]
            assert abs(ours - theirs) <= 1e-3 * abs(ours), (layer.name, ours, theirs)
            checked += 1
    ref = vmap_moments(model, x, y, ins.layers)
    for layer, mom in zip(ins.layers, ref, strict=True):
        ours = row[f"grad/pex/diversity/{layer.name}"]
        assert abs(ours - mom.diversity) <= 1e-3 * abs(mom.diversity), layer.name
    n_params = sum(p.numel() for p in model.parameters())
    kinds = {}
    for layer in ins.layers:
        kinds[layer.kind] = kinds.get(layer.kind, 0) + 1
    print(f"\n## Part 1: residual CNN with BatchNorm (eval), batch {batch}")
    print(f"width {width}, {blocks} residual blocks, {n_params:,} parameters; layers {kinds}")
    print(f"fathom cold first call (discovery + observe): {cold:.3f} s")
    print(f"repeats {repeats} x {iters} calls, interleaved; medians")
    model_cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    ins_cl, _ = _instruments(model_cl, x_cl, y)
    names = {
        "fathom_nchw": "fathom moments, the model as given (NCHW)",
        "fathom_cl": "fathom moments, channels-last model and input",
        "bp": "BackPACK BatchL2Grad+SumGradSquared+Variance",
        "vmap": "vmap(grad) + Grams, the model as given (NCHW)",
        "vmap_cl": "vmap(grad) + Grams, channels-last model and input",
        "step": "SGD step",
        "floor_nchw": "floor: forward + pullback to the layer outputs, NCHW",
        "bound_nchw": "bound: floor + the weight gradients in the same pullback, NCHW",
        "floor_cl": "floor, channels-last",
        "bound_cl": "bound, channels-last",
        "grads_nchw": "grads: floor + every layer's per-example gradients (no Grams), NCHW",
        "grads_cl": "grads, channels-last",
    }
    med = timed(
        {
            names["fathom_nchw"]: lambda: ins.observe(),
            names["fathom_cl"]: lambda: ins_cl.observe(),
            names["bp"]: bp,
            names["vmap"]: lambda: vmap_moments(model, x, y, ins.layers),
            names["vmap_cl"]: lambda: vmap_moments(model_cl, x_cl, y, ins.layers),
            names["step"]: step,
            names["floor_nchw"]: lambda: _floor(ins),
            names["bound_nchw"]: lambda: _bound(ins),
            names["floor_cl"]: lambda: _floor(ins_cl),
            names["bound_cl"]: lambda: _bound(ins_cl),
            names["grads_nchw"]: lambda: _grads(ins),
            names["grads_cl"]: lambda: _grads(ins_cl),
        },
        repeats,
        iters,
    )
    _table(med, names["step"])
    m = {k: med[v] for k, v in names.items()}
    best = min(m["vmap"], m["vmap_cl"])  # vmap in its faster layout
    fathom_s = min(m["fathom_nchw"], m["fathom_cl"])
    print(f"fathom / BackPACK = {m['fathom_nchw'] / m['bp']:.2f} (NCHW)")
    print(f"vmap in its faster layout: {'NCHW' if m['vmap'] <= m['vmap_cl'] else 'channels-last'} "
          f"(channels-last / NCHW = {m['vmap_cl'] / m['vmap']:.2f})")  # fmt: skip
    print(f"fathom NCHW / vmap = {m['fathom_nchw'] / best:.2f}; fathom channels-last / vmap = "
          f"{m['fathom_cl'] / best:.2f}; the faster fathom / vmap = {fathom_s / best:.2f}")  # fmt: skip
    for tag in ("nchw", "cl"):
        floor, bound, f = m["floor_" + tag], m["bound_" + tag], m["fathom_" + tag]
        grads = m["grads_" + tag]
        print(f"{tag}: floor / vmap = {floor / best:.2f}, bound / vmap = {bound / best:.2f} "
              f"(weight gradients {1000 * (bound - floor):.1f} ms; per-example work on top of "
              f"the floor {1000 * (f - floor):.1f} ms)")  # fmt: skip
        print(f"{tag}: grads / vmap = {grads / best:.2f} (per-example gradients "
              f"{1000 * (grads - floor):.1f} ms; Grams, moments and quantiles "
              f"{1000 * (f - grads):.1f} ms)")  # fmt: skip
    print(f"consistency: {checked} conv/linear weights vs BackPACK batch_l2 (rel 1e-3); "
          "every layer's diversity vs vmap (rel 1e-3)")  # fmt: skip
    row_cl = ins_cl.observe()
    worst = max(
        abs(row[k] - row_cl[k]) / max(abs(row[k]), 1e-30)
        for k in row
        if row[k] is not None and row_cl[k] is not None
    )
    print(f"channels-last vs NCHW model: every field within relative {worst:.1e}")
    size = 32  # the stem's and the first block's resolution: the largest per-example products
    kern = conv_kernels(batch, width, size, max(5, repeats))
    print(f"\nper-example weight gradients of one {width}->{width} 3x3 convolution at "
          f"{size}x{size}, batch {batch} (each route checked against the grouped one):")  # fmt: skip
    _table(kern, "batch weight gradient (summed over examples), NCHW")


def part2(batch: int, repeats: int, iters: int, seq: int, dim: int) -> None:
    from backpack import backpack, extend
    from backpack.extensions import BatchL2Grad

    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 100, (batch, seq), generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    torch.manual_seed(1)
    model = TransformerBlock(100, dim, 4).eval()
    try:
        bp_model = extend(TransformerBlock(100, dim, 4), use_converter=True)
        with backpack(BatchL2Grad()):
            extend(nn.CrossEntropyLoss())(bp_model(x), y).backward()
        named = list(bp_model.named_parameters())
        missing = [n for n, p in named if not hasattr(p, "batch_l2")]
        refusal = (
            f"ran, and attached batch_l2 to {len(named) - len(missing)} of {len(named)} "
            f"parameter tensors; silently missing: {', '.join(missing) or 'none'}"
        )
    except Exception as err:  # BackPACK's refusal, reported verbatim
        refusal = f"refused: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
    ins, cold = _instruments(model, x, y)
    kinds = {layer.name: layer.kind for layer in ins.layers}
    print(f"\n## Part 2: transformer block, batch {batch}, sequence {seq}, width {dim}")
    print(f"{sum(p.numel() for p in model.parameters()):,} parameters; layers {kinds}")
    print(f"BackPACK: {refusal}")
    print(f"fathom cold first call (discovery + observe): {cold:.3f} s")
    med = timed(
        {
            "fathom moments": lambda: ins.observe(),
            "vmap(grad) + Grams": lambda: vmap_moments(model, x, y, ins.layers),
            "forward + backward": lambda: F.cross_entropy(model(x), y).backward(),
        },
        repeats,
        iters,
    )
    _table(med, "forward + backward")
    print(f"fathom / vmap = {med['fathom moments'] / med['vmap(grad) + Grams']:.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--dim", type=int, default=32)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# bench_pex on {machine()} (shared development machine; load varies)")
    part1(args.batch, args.width, args.blocks, args.repeats, args.iters)
    part2(args.batch, args.repeats, args.iters, args.seq, args.dim)
    print(f"\nload average at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
