"""pytest plugin: ``python -m pytest -p dg_plugins.domainbed.pytest_plugin ...`` runs
:func:`dg_plugins.domainbed.bridge.install` before collection, so that DomainBed's own test
modules include dg_plugins' algorithms and datasets (and ``$DG_PLUGINS_IMPORT``'s)."""

from __future__ import annotations

_report = None


def pytest_configure(config) -> None:
    global _report
    from dg_plugins.domainbed import bridge

    _report = bridge.install()


def pytest_report_header(config) -> list[str]:
    if _report is None:
        return []
    return [f"dg_plugins bridge: DomainBed at {_report.domainbed_path}; installed algorithms: "
            f"{', '.join(_report.algorithms) or '(none)'}; datasets: "
            f"{', '.join(_report.datasets) or '(none)'}"]
