"""``RAYKIT_CI_NO_SKIPS=1`` (``.ci/run``): any skip but CUDA's fails the run (tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_skip_other_than_cuda_fails_the_run_when_switched_on(tmp_path: Path) -> None:
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_cuda.py").write_text(
        "import pytest\n\n@pytest.mark.skipif(True, reason='needs CUDA')\ndef test_gpu():\n    pass\n\n"
        "def test_runs():\n    assert True\n"
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]

    def pytest_(switch: str) -> subprocess.CompletedProcess[str]:
        # without the installed plugins (xdist, hypothesis, zarr's...): the conftest needs none of them,
        # and loading them is most of each child's start
        env = {**os.environ, "RAYKIT_CI_NO_SKIPS": switch, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    done = pytest_("1")
    assert done.returncode == 0, done.stdout  # CUDA's skip may skip anywhere
    (tmp_path / "test_oracle.py").write_text(
        "import pytest\n\npytest.importorskip('no_such_oracle_package')\n"
    )
    (tmp_path / "test_browser.py").write_text(
        "import pytest\n\ndef test_page():\n    pytest.skip('no chromium binary')\n"
    )
    done = pytest_("1")
    assert done.returncode == 1, done.stdout
    listed = done.stdout.split("skips other than CUDA's fail the run")[1]
    assert "no chromium binary" in listed and "no_such_oracle_package" in listed and "CUDA" not in listed
    assert pytest_("").returncode == 0  # off the switch: a skip is a skip


def test_ci_installs_the_browser_and_switches_skips_off_before_the_test_command() -> None:
    lines = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    before = "\n".join(lines[:-1])
    assert "apt-get install -y --no-install-recommends chromium" in before
    assert "export RAYKIT_CI_NO_SKIPS=1" in before and lines[-1].endswith(".venv/bin/pytest")
