"""The run directory contract's one owner: manifest type, writer (locked, digested,
atomic) and reader. See ``docs/architecture.md`` ("Run directory").

Names load on first use (:mod:`fathom.base.lazy`): reading a manifest (``RunDir``) costs no torch;
weights files and the writer import it when used."""

from fathom.base.lazy import exports

__getattr__, __dir__, __all__ = exports(
    __name__,
    {
        "fathom.rundir.filecheck": ["refuse_links_out", "resume_file"],
        "fathom.rundir.files": ["load_resume", "load_weights", "save_resume", "save_weights"],
        "fathom.rundir.lock": ["DirLock", "lock_holder", "study_lock"],
        "fathom.rundir.state": ["RunState", "run_state"],
        "fathom.rundir.header": [
            "FORMAT",
            "MANIFEST_KINDS",
            "PHASES",
            "STATUSES",
            "ManifestHeader",
        ],
        "fathom.rundir.manifest": ["check_manifest", "seal"],
        "fathom.rundir.record": [
            "AuditRecord",
            "AuditedRun",
            "CurvatureRecord",
            "CurvatureSummary",
            "RecordedRun",
            "RunManifest",
        ],
        "fathom.rundir.reader": ["RunDir", "Which", "find_runs", "read_audit", "read_curvature"],
        "fathom.rundir.writer": ["RunWriter"],
    },
)
