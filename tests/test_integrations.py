"""The Lightning and Hugging Face callbacks with the real libraries, on tiny models (CPU, a few
steps): rows at epoch ends, the instruments' values those of an independent observation,
training unchanged by observing, and the logs read back by each target's own reader."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from fathom.errors import FathomError
from fathom.integrations.observer import EpochObserver, numbers
from fathom.telemetry.instruments import Instruments

CLASSES, FEATURES = 3, 6


def _data(n: int = 48, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 1).long()
    return x, y


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.ReLU(), nn.Linear(8, CLASSES))


# -- Lightning ------------------------------------------------------------------------------
def _lightning_module(seed: int = 0):
    import lightning.pytorch as pl

    class Tiny(pl.LightningModule):
        def __init__(self, lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = _net(seed)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch, i):  # type: ignore[no-untyped-def]
            x, y = batch
            loss = nn.functional.cross_entropy(self(x), y)
            self.log("train_loss", loss, on_epoch=True, on_step=False)
            return loss

        def validation_step(self, batch, i):  # type: ignore[no-untyped-def]
            x, y = batch
            self.log("val_loss", nn.functional.cross_entropy(self(x), y))

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    return Tiny()


def _fit(module, callbacks, epochs: int = 2) -> None:  # type: ignore[no-untyped-def]
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)  # draws the global RNG
    trainer = pl.Trainer(
        max_epochs=epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        deterministic=True,
    )
    trainer.fit(module, loader, DataLoader(TensorDataset(x, y), batch_size=16))


def test_lightning_callback_observes_each_epoch(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="install the lightning extra")
    pytest.importorskip("tensorboard", reason="install the tensorboard extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fathom.integrations.lightning import FathomCallback

    x, y = _data(16, seed=1)
    cb = FathomCallback(tmp_path / "logs", probe=(x, y), families=("probe", "params"), name="tiny")
    module = _lightning_module()
    _fit(module, [cb])
    assert [r["epoch"] for r in cb.rows] == [0, 1, 2]
    assert cb.reports and all(r.ok for r in cb.reports), [r.lines() for r in cb.reports]
    last = cb.rows[-1]
    assert "val_loss" in last and "train_loss" in last and "val_loss" not in cb.rows[0]
    # the instruments' values are those of an independent observation of the final model
    with Instruments(module, x, y, ("probe", "params")) as ins:
        fresh = ins.observe()
    assert last["probe/ce"] == pytest.approx(fresh["probe/ce"], rel=1e-6)
    assert last["probe/ce"] == pytest.approx(
        nn.functional.cross_entropy(module(x).double(), y).item(), rel=1e-5
    )
    assert cb.rows[0]["param/disp/net.0"] == 0.0 and last["param/disp/net.0"] > 0
    acc = EventAccumulator(str(tmp_path / "logs" / "tensorboard" / "tiny"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("probe/ce")] == [0, 1, 2]
    assert [e.wall_time for e in acc.Scalars("probe/ce")] == [r["clock/unix_s"] for r in cb.rows]


def test_lightning_training_is_unchanged_by_observing(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="install the lightning extra")
    from fathom.integrations.lightning import FathomCallback

    x, y = _data(16, seed=1)
    plain, observed = _lightning_module(), _lightning_module()
    torch.manual_seed(5)
    _fit(plain, [])
    torch.manual_seed(5)
    _fit(observed, [FathomCallback(tmp_path / "l", probe=(x, y), families="all")])
    for (name, a), (_, b) in zip(plain.state_dict().items(), observed.state_dict().items()):
        assert torch.equal(a, b), name


def test_lightning_callback_logs_to_wandb(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="install the lightning extra")
    pytest.importorskip("wandb", reason="install the wandb extra")
    from fathom.integrations.lightning import FathomCallback

    x, y = _data(16, seed=1)
    cb = FathomCallback(
        tmp_path / "logs", probe=(x, y), targets=("wandb", "tensorboard"), families="probe",
        name="tiny-wb", group="tiny",
    )  # fmt: skip
    _fit(_lightning_module(), [cb], epochs=1)
    assert sorted(r.target for r in cb.reports) == ["callback tensorboard", "callback wandb"]
    assert all(r.ok for r in cb.reports), [r.lines() for r in cb.reports]
    wb = next(r for r in cb.reports if r.target == "callback wandb")
    assert wb.rows == 2 and wb.values > 10
    assert list((tmp_path / "logs" / "wandb" / "wandb").glob("offline-run-*/run-tiny-wb.wandb"))


# -- Hugging Face ---------------------------------------------------------------------------
class HFTiny(nn.Module):
    """A plain module the Trainer accepts: ``forward(x, labels)`` -> ``{"loss", "logits"}``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _net(0)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.net(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


class Rows(torch.utils.data.Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


def test_huggingface_callback_observes_each_epoch(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="install the huggingface extra")
    pytest.importorskip("tensorboard", reason="install the tensorboard extra")
    from transformers import Trainer, TrainingArguments

    from fathom.integrations.huggingface import FathomCallback

    x, y = _data()
    px, py = _data(16, seed=1)
    cb = FathomCallback(tmp_path / "logs", probe=(px, py), families=("probe", "params"), name="hf")
    args = TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        num_train_epochs=2,
        per_device_train_batch_size=16,
        learning_rate=0.1,
        eval_strategy="epoch",
        logging_strategy="epoch",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    model = HFTiny()
    trainer = Trainer(
        model=model, args=args, train_dataset=Rows(x, y), eval_dataset=Rows(px, py), callbacks=[cb]
    )
    trainer.train()
    assert [r["epoch"] for r in cb.rows] == [0, 1, 2]
    assert all(r.ok for r in cb.reports), [r.lines() for r in cb.reports]
    one = cb.rows[1]
    assert "loss" in one and "eval_loss" in one and "learning_rate" in one
    assert isinstance(one["epoch"], int)  # the Trainer's fractional epoch is not a row field
    # eval_loss on the probe set equals the probe CE the instruments measured at that epoch
    assert one["eval_loss"] == pytest.approx(one["probe/ce"], rel=1e-5)
    with torch.no_grad():
        final = nn.functional.cross_entropy(model(px)["logits"].double(), py).item()
    assert cb.rows[-1]["probe/ce"] == pytest.approx(final, rel=1e-5)
    assert cb.rows[-1]["param/disp/model.net.0"] > 0


# -- the observer itself --------------------------------------------------------------------
def test_observer_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    x, y = _data(8)
    with pytest.raises(FathomError, match="unknown live target 'jsonl'"):
        EpochObserver(tmp_path, (x, y), targets=("jsonl",))
    with pytest.raises(FathomError, match="probe must be a pair"):
        EpochObserver(tmp_path, x)  # type: ignore[arg-type]
    obs = EpochObserver(tmp_path / "o", (x, y), families="probe")
    with pytest.raises(FathomError, match="before start"):
        obs.observe(1)
    obs.start(_net(), {"optim": {"lr": 0.1}})
    obs.observe(0)
    with pytest.raises(FathomError, match="epoch 0 observed after epoch 0"):
        obs.observe(0)
    assert all(r.ok for r in obs.close())
    again = EpochObserver(tmp_path / "o", (x, y), families="probe")
    with pytest.raises(FathomError, match="already holds a log"):
        again.start(_net(), {})


def test_numbers_keeps_one_number_entries() -> None:
    got = numbers({"a": torch.tensor(2.5), "b": torch.ones(2), "c": "x", "d": 3, "e": math.inf})
    assert got == {"a": 2.5, "d": 3, "e": math.inf}


class Tokens(torch.utils.data.Dataset):
    def __init__(self, ids: torch.Tensor, y: torch.Tensor) -> None:
        self.ids, self.y = ids, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.y[i]}


def test_huggingface_callback_on_a_tiny_transformer(tmp_path: Path) -> None:
    """A real ``BertForSequenceClassification`` (built from a config, no download): the logits
    come from its ``ModelOutput``; the probe CE is that of the trained model, in float64."""
    pytest.importorskip("transformers", reason="install the huggingface extra")
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    from fathom.integrations.huggingface import FathomCallback

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16, num_labels=CLASSES,
    )  # fmt: skip
    model = BertForSequenceClassification(config)
    g = torch.Generator().manual_seed(3)
    ids, y = (
        torch.randint(0, 40, (32, 6), generator=g),
        torch.randint(0, CLASSES, (32,), generator=g),
    )
    cb = FathomCallback(tmp_path / "logs", probe=(ids[:8], y[:8]), families=("probe",), name="bert")
    args = TrainingArguments(
        output_dir=str(tmp_path / "hf"), num_train_epochs=1, per_device_train_batch_size=16,
        learning_rate=1e-3, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=Tokens(ids, y), callbacks=[cb]).train()
    assert [r["epoch"] for r in cb.rows] == [0, 1]
    assert all(r.ok for r in cb.reports), [r.lines() for r in cb.reports]
    model.eval()
    with torch.no_grad():
        ce = nn.functional.cross_entropy(model(ids[:8]).logits.double(), y[:8]).item()
    assert cb.rows[-1]["probe/ce"] == pytest.approx(ce, rel=1e-5)
    assert cb.rows[-1]["probe/ce"] != cb.rows[0]["probe/ce"]
