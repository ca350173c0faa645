"""Where the runs of a study execute: this process, N local worker processes, Ray, or Slurm
(:mod:`fathom.study.slurm`, through submitit).

Every backend calls :func:`fathom.study.execute.execute_run` once per run and returns
its :class:`RunOutcome` s in the order of the specs; a run is the same computation on
every backend (same config, same seeds, same torch thread count), so it ends with the
same final-parameter hash. On the CPU that needs the same torch thread count, so every
backend sets ``torch.set_num_threads(threads)`` in the process that trains (the count is
recorded in each manifest's ``environment.threads``).

The backends are one table, :data:`BACKENDS` (name -> the backend's class as a
``"module:Class"`` path, the command-line options only it reads, the optional extra it
needs): :func:`make_backend` builds from it and the commands take their ``--backend``
choices and option checks from it, so a new backend is its module and one row; an unknown
name is refused with the known ones ("did you mean"). This module imports no torch, pydantic
or worker pool until a backend runs, so a command's parser can read the table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fathom.errors import FathomError, install_hint, with_suggestion

if TYPE_CHECKING:
    from fathom.config.live import LiveConfig
    from fathom.study.execute import RunOutcome
    from fathom.study.plan import RunSpec

_OnOutcome = Callable[["RunOutcome"], None]
"""Called with each run's outcome as the run ends (the study's per-run line)."""


def wants_cuda(specs: Sequence[RunSpec]) -> bool:
    """True when a run would train on CUDA here (device ``cuda``, or ``auto`` with a GPU)."""
    import torch

    devices = {s.config.get("device", "auto") for s in specs}
    return bool(devices & {"auto", "cuda"}) and torch.cuda.is_available()


@dataclass
class LocalBackend:
    """Sequential in this process (``workers == 1``) or ``workers`` local worker processes
    (forked from a forkserver that has imported torch: :func:`fathom.study.pool.pool_context`)."""

    workers: int = 1
    threads: int = 1
    splits_for: Any = None
    live: LiveConfig | tuple[str, ...] = ()
    tracker: Any = None  # LiveTracker-like factory (commands pass fathom.export.live's)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise FathomError(f"--workers must be at least 1, got {self.workers}")

    @classmethod
    def from_options(cls, o: BackendOptions) -> LocalBackend:
        return cls(workers=o.workers, **o.common())

    @property
    def name(self) -> str:
        return f"local ({self.workers} worker{'s' if self.workers > 1 else ''}, {self.threads} thread(s) per run)"

    def run(
        self,
        specs: Sequence[RunSpec],
        *,
        retry_failed: bool,
        registry_file: str | None,
        progress: _OnOutcome | None = None,
        allow_source_change: bool = False,
    ) -> list[RunOutcome]:
        from concurrent.futures import as_completed

        from fathom.study.execute import execute_run
        from fathom.study.pool import local_pool, worker_devices

        kwargs = dict(
            retry_failed=retry_failed,
            allow_source_change=allow_source_change,
            threads=self.threads,
            registry_file=registry_file,
            splits_for=self.splits_for,
            live=self.live,
            tracker=self.tracker,
        )
        if self.workers == 1 or len(specs) <= 1:
            outs = []
            for s in specs:
                outs.append(execute_run(s, **kwargs))
                if progress is not None:
                    progress(outs[-1])
            return outs
        results: dict[str, RunOutcome] = {}
        n = min(self.workers, len(specs))
        with local_pool(worker_devices(n) if wants_cuda(specs) else [None] * n) as pool:
            futures = {pool.submit(execute_run, s, **kwargs): s for s in specs}
            for fut in as_completed(futures):
                out = fut.result()
                results[out.run_id] = out
                if progress is not None:
                    progress(out)
        return [results[s.run_id] for s in specs]


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise FathomError(
            f"the Ray backend needs the optional extra: {install_hint('ray')} "
            "(or use --backend local)"
        ) from None
    return ray


@dataclass
class RayBackend:
    """One Ray task per run on an existing cluster (``address``) or a local one (``None``).

    Each task asks for one CPU, and one GPU when the cluster has GPUs. The run directories
    are written by the tasks, so ``--runs-dir`` must be a path every node shares; the
    registry is written by this (driver) process from the returned outcomes.
    """

    address: str | None = None
    threads: int = 1
    splits_for: Any = None
    live: LiveConfig | tuple[str, ...] = ()
    tracker: Any = None  # LiveTracker-like factory (commands pass fathom.export.live's)

    @classmethod
    def from_options(cls, o: BackendOptions) -> RayBackend:
        return cls(address=o.address, **o.common())

    @property
    def name(self) -> str:
        return f"ray ({self.address or 'local cluster'}, {self.threads} thread(s) per run)"

    def run(
        self,
        specs: Sequence[RunSpec],
        *,
        retry_failed: bool,
        registry_file: str | None,
        progress: _OnOutcome | None = None,
        allow_source_change: bool = False,
    ) -> list[RunOutcome]:
        ray = _import_ray()
        from fathom.study.execute import execute_run

        if not ray.is_initialized():
            try:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise FathomError(
                    f"cannot connect to the Ray cluster at {self.address!r} ({e}); start it with "
                    "`ray start --head` or pass the right --address (omit it for a local cluster)"
                ) from None
        gpus = 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0
        task = ray.remote(num_cpus=self.threads, num_gpus=gpus, max_retries=0)(execute_run)
        refs = {
            task.remote(
                s,
                retry_failed=retry_failed,
                threads=self.threads,
                splits_for=self.splits_for,
                allow_source_change=allow_source_change,
                live=self.live,
                tracker=self.tracker,
            ): s
            for s in specs
        }
        results: dict[str, RunOutcome] = {}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                out = ray.get(done[0])
            except ray.exceptions.RayTaskError as e:
                cause = e.cause if hasattr(e, "cause") else e
                if isinstance(cause, FathomError):
                    raise cause from None
                raise
            if registry_file is not None:
                from fathom.study.records import registry_row
                from fathom.study.registry import Registry

                Registry(registry_file).upsert([registry_row(refs[done[0]])])
            results[out.run_id] = out
            if progress is not None:
                progress(out)
        return [results[s.run_id] for s in specs]


@dataclass(frozen=True)
class BackendOptions:
    """What a command gives :func:`make_backend`; each backend's ``from_options`` takes the
    common fields (:meth:`common`) and its own (``workers``: local; ``address``: Ray;
    ``slurm``: :class:`fathom.study.slurm.SlurmBackend` fields)."""

    threads: int = 1
    splits_for: Any = None
    live: LiveConfig | tuple[str, ...] = ()
    tracker: Any = None
    workers: int = 1
    address: str | None = None
    slurm: Mapping[str, Any] | None = None

    def common(self) -> dict[str, Any]:
        """The fields every backend takes: torch threads, splits, live logging."""
        return {
            "threads": self.threads,
            "splits_for": self.splits_for,
            "live": self.live,
            "tracker": self.tracker,
        }


@dataclass(frozen=True)
class BackendKind:
    """One way to execute a study's runs (``--backend NAME``): a row of :data:`BACKENDS`."""

    cls: str
    """``"fathom.study.X:Class"``: the backend, built by its ``from_options`` (its module is
    imported only when chosen; Ray and submitit only when a run starts)."""
    options: tuple[str, ...]
    """The command-line options only this backend reads (given with another, refused)."""
    extra: str | None
    """The optional dependency extra it needs at run time (:func:`fathom.errors.install_hint`)."""
    help: str


BACKENDS: dict[str, BackendKind] = {
    "local": BackendKind(
        "fathom.study.backends:LocalBackend",
        (),
        None,
        "this process, or --workers local worker processes",
    ),
    "ray": BackendKind(
        "fathom.study.backends:RayBackend", ("--address",), "ray", "one Ray task per run"
    ),
    "slurm": BackendKind(
        "fathom.study.slurm:SlurmBackend",
        ("--slurm-partition", "--slurm-gpus"),
        "slurm",
        "submitit jobs (a Slurm job array on a cluster)",
    ),
}
"""The backends (module docstring), in the order the commands list them."""


def _backend_kind(name: str) -> BackendKind:
    """The row of ``name``; an unknown backend is refused naming the known ones."""
    row = BACKENDS.get(name)
    if row is None:
        known = list(BACKENDS)
        head = with_suggestion(f"unknown backend {name!r}", str(name), known)
        raise FathomError(f"{head}; choose one of {', '.join(known)}")
    return row


def make_backend(
    name: str,
    *,
    workers: int = 1,
    address: str | None = None,
    threads: int = 1,
    splits_for: Any = None,
    slurm: dict[str, Any] | None = None,
    live: LiveConfig | tuple[str, ...] = (),
    tracker: Any = None,
):
    """The backend called ``name``, built by its row of :data:`BACKENDS` from these options
    (each backend reads its own: ``workers`` local, ``address`` Ray, ``slurm`` the
    :class:`fathom.study.slurm.SlurmBackend` fields)."""
    module, _, cls = _backend_kind(name).cls.partition(":")
    options = BackendOptions(threads, splits_for, live, tracker, workers, address, slurm)
    return getattr(importlib.import_module(module), cls).from_options(options)
