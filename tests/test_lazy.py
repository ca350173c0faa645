"""Lazy package exports: importing a package costs nothing until one of its names is used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")
PACKAGES = ("audit", "curvature", "data", "depthscale", "export", "report", "telemetry")


def _fresh_python(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter on this tree's ``src`` (nothing imported beforehand)."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out


def test_packages_import_without_torch_and_resolve_every_name_on_use():
    code = (
        "import importlib, sys\n"
        f"for p in {PACKAGES!r}:\n"
        "    importlib.import_module('fathom.' + p)\n"
        "print('torch' in sys.modules, 'numpy' in sys.modules)\n"
        "import fathom.data\n"
        "fathom.data.DataSplits\n"
        "print('torch' in sys.modules)\n"
    )
    out = _fresh_python(code)
    assert out.stdout.split() == ["False", "False", "True"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_resolves(package: str):
    import importlib

    mod = importlib.import_module(f"fathom.{package}")
    for name in mod.__all__:
        value = getattr(mod, name)
        assert value is getattr(mod, name) and name in dir(mod)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mod.nope  # noqa: B018
    from fathom.data import DataSplits
    from fathom.data.splits import DataSplits as direct

    assert DataSplits is direct


def test_a_forwarding_package_is_its_module_and_costs_nothing():
    """``fathom.config`` forwards to ``fathom.config.run`` (``fathom.base.lazy.forward``): every
    name of the module is the package's, and importing the package (or a light submodule of
    it) builds no model and imports no torch."""
    code = (
        "import sys, fathom.config, fathom.config.models\n"
        "print('fathom.config.run' in sys.modules, 'torch' in sys.modules)\n"
    )
    out = _fresh_python(code)
    assert out.stdout.split() == ["False", "False"]
    import fathom.config
    import fathom.config.run as run

    names = [n for n in vars(run) if not n.startswith("__")]
    assert "RunConfig" in names and "_Strict" in names
    assert all(getattr(fathom.config, n) is getattr(run, n) for n in names)
    assert set(names) <= set(dir(fathom.config))
    with pytest.raises(AttributeError, match="'fathom.config' has no attribute 'nope'"):
        fathom.config.nope  # noqa: B018


def test_import_fathom_stays_light_and_reaches_every_package():
    code = (
        "import sys, fathom\n"
        "light = 'torch' not in sys.modules and 'pydantic' not in sys.modules\n"
        "fathom.rundir.RunDir, fathom.load_run, fathom.load_study\n"
        "print(light, 'torch' in sys.modules, sorted(set(dir(fathom)) >= {'rundir', 'load_run'} and ['ok']))\n"
    )
    out = _fresh_python(code)
    assert out.stdout.split() == ["True", "False", "['ok']"]
