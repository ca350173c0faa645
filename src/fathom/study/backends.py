"""Where the runs of a study execute: this process, N local worker processes, Ray, or Slurm
(:mod:`fathom.study.slurm`, through submitit).

Every backend calls :func:`fathom.study.execute.execute_run` once per run and returns
its :class:`RunOutcome` s in the order of the specs; a run is the same computation on
every backend (same config, same seeds, same torch thread count), so it ends with the
same final-parameter hash. On the CPU that needs the same torch thread count, so every
backend sets ``torch.set_num_threads(threads)`` in the process that trains (the count is
recorded in each manifest's ``environment.threads``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import as_completed
from dataclasses import dataclass
from typing import Any

from fathom.config.live import LiveConfig
from fathom.errors import FathomError, install_hint
from fathom.study.execute import RunOutcome, execute_run
from fathom.study.plan import RunSpec
from fathom.study.pool import local_pool, worker_devices

_OnOutcome = Callable[[RunOutcome], None]
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
    """The backend called ``name``; ``slurm`` holds :class:`fathom.study.slurm.SlurmBackend` fields."""
    if name == "local":
        return LocalBackend(
            workers=workers, threads=threads, splits_for=splits_for, live=live, tracker=tracker
        )
    if name == "ray":
        return RayBackend(
            address=address, threads=threads, splits_for=splits_for, live=live, tracker=tracker
        )
    if name == "slurm":
        from fathom.study.slurm import SlurmBackend

        return SlurmBackend(
            threads=threads, splits_for=splits_for, live=live, tracker=tracker, **(slurm or {})
        )
    raise FathomError(f"unknown backend {name!r}; use 'local', 'ray' or 'slurm'")
