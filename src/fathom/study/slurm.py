"""Slurm backend: one Slurm job-array task per run, submitted through submitit.

Each task calls :func:`fathom.study.execute.execute_run` -- the same function every backend
calls -- with the same thread count, so a run ends with the same final-parameter hash as on
the local backend. The run directories are written by the tasks, so ``--runs-dir`` must be
on a file system every node shares (the submitit ``folder`` too); the registry is written
by this (submitting) process from the returned outcomes. A task that Slurm preempts or
times out is resubmitted by nobody: rerun the study and it resumes from the run's last epoch
boundary.

``cluster`` picks submitit's executor: ``"slurm"``, ``"local"`` (each run a subprocess on
this machine, no Slurm needed) or ``"debug"`` (in this process); ``None`` lets submitit
choose (Slurm when ``sbatch`` is available, else local). Needs the ``slurm`` extra
(``pip install -e '.[slurm]'``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fathom.config.live import LiveConfig
from fathom.errors import FathomError, install_hint
from fathom.study.backends import BackendOptions
from fathom.study.execute import RunOutcome, execute_run
from fathom.study.plan import RunSpec


def _import_submitit() -> Any:
    try:
        import submitit
    except ImportError:
        raise FathomError(
            f"the Slurm backend needs the optional extra: {install_hint('slurm')} "
            "(submitit; or use --backend local)"
        ) from None
    return submitit


@dataclass
class SlurmBackend:
    """Runs as submitit jobs (a Slurm job array on a cluster); see the module docstring."""

    folder: str = "runs/submitit"
    cluster: str | None = None
    threads: int = 1
    gpus_per_task: int = 0
    partition: str | None = None
    timeout_min: int = 180
    mem_gb: float | None = None
    array_parallelism: int = 64
    splits_for: Any = None
    live: LiveConfig | tuple[str, ...] = ()
    tracker: Any = None  # LiveTracker-like factory (commands pass fathom.export.live's)

    @classmethod
    def from_options(cls, o: BackendOptions) -> SlurmBackend:
        return cls(**o.common(), **(o.slurm or {}))

    @property
    def name(self) -> str:
        where = self.cluster or "auto"
        return f"slurm via submitit ({where}, {self.threads} thread(s) per run, {self.gpus_per_task} GPU(s) per run)"

    def executor(self) -> Any:
        submitit = _import_submitit()
        ex = submitit.AutoExecutor(folder=str(Path(self.folder)), cluster=self.cluster)
        params: dict[str, Any] = {
            "name": "fathom-study",
            "timeout_min": self.timeout_min,
            "cpus_per_task": self.threads,
            "gpus_per_node": self.gpus_per_task,
            "tasks_per_node": 1,
            "nodes": 1,
        }
        if self.mem_gb is not None:
            params["mem_gb"] = self.mem_gb
        if ex.cluster == "slurm":
            params["slurm_array_parallelism"] = self.array_parallelism
            if self.partition:
                params["slurm_partition"] = self.partition
        ex.update_parameters(**params)
        return ex

    def run(
        self,
        specs: Sequence[RunSpec],
        *,
        retry_failed: bool,
        registry_file: str | None,
        progress: Any = None,
        allow_source_change: bool = False,
    ) -> list[RunOutcome]:
        if not specs:
            return []
        submitit = _import_submitit()
        task = functools.partial(
            execute_run,
            retry_failed=retry_failed,
            allow_source_change=allow_source_change,
            threads=self.threads,
            splits_for=self.splits_for,
            live=self.live,
            tracker=self.tracker,
        )
        executor = self.executor()
        jobs = executor.map_array(task, list(specs))
        spec_of = {id(job): spec for job, spec in zip(jobs, specs, strict=True)}
        out_of: dict[int, RunOutcome] = {}
        # completion order, so progress and the registry follow the runs as they end; a job's
        # state is read from its own process on this machine (poll often) or from Slurm
        # accounting (submitit's watcher; once a second, as Job.wait polls)
        poll_s = 1.0 if executor.cluster == "slurm" else 0.05
        for job in submitit.helpers.as_completed(jobs, poll_frequency=poll_s):
            spec = spec_of[id(job)]
            try:
                out = job.result()
            except submitit.core.utils.FailedJobError as e:
                cause = _fathom_error(e)
                if cause is not None:
                    raise cause from None
                raise FathomError(
                    f"Slurm task {job.job_id} for run {spec.run_id} failed: {str(e).splitlines()[0]}"
                    f"; its log is under {self.folder}. Rerun the study to resume it"
                ) from None
            if registry_file is not None:
                from fathom.study.records import registry_row
                from fathom.study.registry import Registry

                Registry(registry_file).upsert([registry_row(spec)])
            out_of[id(job)] = out
            if progress is not None:
                progress(out)
        return [out_of[id(job)] for job in jobs]


def _fathom_error(e: Exception) -> FathomError | None:
    """The task's own :class:`FathomError` (bad input), recovered from submitit's message."""
    text = str(e)
    marker = "fathom.errors.FathomError: "
    if marker in text:
        return FathomError(text.split(marker, 1)[1].strip().splitlines()[0])
    return None
