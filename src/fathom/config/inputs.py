"""What a run's config names outside itself: factories to import and data paths to read.

The schema (:mod:`fathom.config.run`) checks a config's values; :func:`check_inputs` checks
that what they name is there, so ``fathom validate`` answers what ``fathom train`` would
meet seconds later: a ``python``-kind factory (``model.factory``, ``data.factory``) is
imported and its function found (not called: building a model or a dataset is the run's
work), ``data.path`` must be a file and ``data.data_dir`` must exist.

Importing a factory runs the code of its module: it is code the user's own config names,
as ``fathom train`` would import it (a factory named by a *shared* run directory is the
threat model's concern, ``docs/architecture.md``). Torch is imported only when the factory's
module imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fathom.base.user_code import resolve_factory
from fathom.errors import FathomError

if TYPE_CHECKING:
    from fathom.config.model_kinds import ModelSpec
    from fathom.config.models import DataConfig


def _find_factory(path: str, key: str) -> None:
    """Import ``path``'s module and find its callable (:func:`resolve_factory`); an exception
    the module raises while it is imported (a syntax error, a failing import of its own) is
    a :class:`FathomError` naming the factory, not a traceback."""
    try:
        resolve_factory(path, key)
    except FathomError:
        raise
    except Exception as e:
        raise FathomError(
            f"{key} = {path!r}: importing its module raised {type(e).__name__}: {e}; fix the "
            "module (python -c 'import MODULE' shows where)"
        ) from None


def check_data_dir(data_dir: str | None, key: str, dataset: str) -> str | None:
    """A given data directory (or CIFAR archive) must exist: a misspelt one is never passed
    over for the cache in silence. ``key`` names the setting (``data.data_dir``,
    ``--data-dir``)."""
    if data_dir is None or Path(data_dir).expanduser().exists():
        return data_dir
    raise FathomError(
        f"{key} {data_dir!r} does not exist: it names the directory (or CIFAR archive) that "
        f"holds the {dataset} files, read before the cache; give an existing one, or leave "
        f"{key} out to use the cache (`fathom data fetch {dataset}` downloads into it)"
    )


def _check_data(data: DataConfig) -> list[str]:
    """The data's named inputs exist (and its factory imports); one line per thing checked."""
    checked = []
    if data.path is not None:
        if not Path(data.path).is_file():
            what = "is a directory" if Path(data.path).is_dir() else "does not exist"
            holding = (
                "the UTF-8 text file"
                if data.dataset == "text"
                else "the .npz or .pt file holding the arrays"
            )
            raise FathomError(
                f"data.path {data.path!r} {what}; give {holding} (a relative path is read "
                "from the directory you run fathom in)"
            )
        checked.append(f"data.path {data.path}: a file")
    if data.data_dir is not None:
        check_data_dir(data.data_dir, "data.data_dir", data.dataset)
        checked.append(f"data.data_dir {data.data_dir}: exists")
    if data.factory is not None:
        _find_factory(data.factory, "data.factory")
        checked.append(f"data.factory {data.factory}: imported, callable")
    return checked


def check_inputs(data: DataConfig, model: ModelSpec) -> list[str]:
    """:func:`_check_data`, and the factory of a model kind built by a user's factory
    (``python``) imported and found."""
    from fathom.config.model_kinds import model_kind

    checked = _check_data(data)
    key = model_kind(model.kind).factory
    if key is not None:
        path = getattr(model, key)
        _find_factory(path, f"model.{key}")
        checked.append(f"model.{key} {path}: imported, callable")
    return checked


def what_defaults_train() -> str:
    """What a config that names no model would train: the defaults, said in one phrase
    (``the full-width Ciresan MLP (2500-2000-1500-1000-500) for 100 epochs on all of mnist``)."""
    from fathom.config.run import RunConfig

    d = RunConfig()
    widths = "-".join(map(str, d.model.widths))  # type: ignore[union-attr]  # the default is Ciresan
    return f"the full-width Ciresan MLP ({widths}) for {d.optim.epochs} epochs on all of {d.data.dataset}"


def require_base_model(data: dict[str, object], origin: str) -> None:
    """Refuse a study file whose ``[base]`` names no model: every run of its grid would train
    the defaults (:func:`what_defaults_train`) without the user having chosen them. A shipped
    study preset always names one."""
    base = data.get("base")
    if isinstance(base, dict) and base.get("model"):
        return
    raise FathomError(
        f"{origin} names no model (no [base.model] table, or an empty one): every run of the "
        f"study would train {what_defaults_train()}. Name the model under [base.model] (e.g. "
        "widths = [256, 128] and width_mult), or start from a study preset: fathom validate "
        "ciresan-sd-quick"
    )
