"""The run coordinator loads from every path a ``dagster.yaml`` may name: ``dw_dagster.guard`` (the one
the docs and ``dw-dagster`` write), the package root, and ``dw_dagster.repair.guard``, the path before
the guard got its own package (deprecated, kept so existing instance configs keep loading)."""

import textwrap
from pathlib import Path

import dagster as dg
import pytest

import dw_dagster.repair.guard as old_path
from dw_dagster.guard import GuardedRunCoordinator, guarded_executor


@pytest.mark.parametrize("module", ["dw_dagster.guard", "dw_dagster", "dw_dagster.repair.guard"])
def test_an_instance_loads_the_guarded_run_coordinator_from_each_path(tmp_path, module):
    (tmp_path / "dagster.yaml").write_text(textwrap.dedent(f"""\
        telemetry:
          enabled: false
        run_coordinator:
          module: {module}
          class: GuardedRunCoordinator
          config: {{max_concurrent_runs: 2}}
        """))
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert type(instance.run_coordinator) is GuardedRunCoordinator


def test_the_deprecated_module_only_re_exports_the_guard():
    """``dw_dagster.repair.guard`` is the same objects under the old name, a few lines saying so."""
    assert old_path.GuardedRunCoordinator is GuardedRunCoordinator and old_path.guarded_executor is guarded_executor
    assert "Deprecated" in (old_path.__doc__ or "")
    assert len(Path(old_path.__file__).read_text().splitlines()) < 15
