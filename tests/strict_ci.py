"""A pytest plugin (loaded by conftest.py): under CI a skip is a failure that names its reason."""
import os

import pytest

# On a user's machine a test may skip (no Chromium, the real pair not prepared), saying why. .ci/run sets
# CALM_CI=1: there every part the tests need must be set up, so a skip would hide a test that never ran.

STRICT = os.environ.get("CALM_CI") == "1"


def _reason(longrepr) -> str:
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI (CALM_CI=1), which allows no skip: {_reason(report.longrepr)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"{collector.nodeid} skipped under CI (CALM_CI=1), which allows no skip: {_reason(report.longrepr)}"
