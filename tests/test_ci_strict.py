"""Under CI (CALM_CI=1, set by .ci/run) a skipped test or module is a failure that names its reason;
elsewhere a skip stays a skip."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

SKIPPING = {
    "test_skips.py": "import pytest\n\ndef test_needs_chromium():\n    pytest.skip('no Chromium here')\n\n"
                     "@pytest.mark.xfail(reason='known')\ndef test_known_bug():\n    assert False\n",
    "test_module_skip.py": "import pytest\npytest.skip('the real pair is not prepared', allow_module_level=True)\n",
}


def run_suite(folder: Path, ci: bool, target: str = ".") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CALM_CI"}
    if ci:
        env["CALM_CI"] = "1"
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "tests.strict_ci",
                           target],
                          capture_output=True, text=True, env=env, cwd=folder, timeout=120)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    folder = tmp_path_factory.mktemp("suite")
    for name, text in SKIPPING.items():
        (folder / name).write_text(text)
    return folder


def test_a_skipped_test_fails_under_ci_naming_the_reason(suite):
    result = run_suite(suite, ci=True, target="test_skips.py")
    out = result.stdout
    assert result.returncode != 0, out
    assert "1 failed" in out and "1 xfailed" in out and "skipped" not in out.splitlines()[-1], out
    assert "no Chromium here" in out, out


def test_a_skipped_module_is_a_collection_error_under_ci(suite):
    result = run_suite(suite, ci=True, target="test_module_skip.py")
    out = result.stdout
    assert result.returncode != 0, out
    assert "1 error" in out and "the real pair is not prepared" in out, out


def test_skips_stay_skips_elsewhere(suite):
    result = run_suite(suite, ci=False)
    assert result.returncode == 0, result.stdout
    assert "2 skipped" in result.stdout and "1 xfailed" in result.stdout, result.stdout
