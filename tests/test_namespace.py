"""engram installs under one name: a project with its own ``worker.py``, ``jobs/`` and
``web/`` (common names) keeps them, and still reaches engram's Producer as
``from engram import Producer``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
from pathlib import Path

import pytest
import redis

from engram.worker import keys
from tests.redis_fixtures import REPO

pytestmark = pytest.mark.slow

APP = """
import json
import sys

import jobs
import web
import worker
from engram import Producer, Scope, Store

producer = Producer.from_url(sys.argv[1])
pending = producer.remember({"user_id": "ada"}, "Ada keeps her own worker.py.")
print(json.dumps({
    "mine": [worker.MINE, jobs.MINE, web.MINE],
    "operation_id": pending.operation_id,
    "engram": Producer.__module__,
    "store": Store.__module__,
    "scope": Scope.__module__,
}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment holding engram as a user installs it (a wheel built
    from a copy of this tree, not an editable link to it), its dependencies taken from
    this one."""
    base = tmp_path_factory.mktemp("installed")
    source = _source_copy(base)
    env = base / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # The dependencies: this environment's packages, as a plain path (its .pth files,
    # among them the editable link to this tree, are not read).
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, source],
        check=True,
        capture_output=True,
    )
    return python


# What a build of the tree must not see: a checkout's own builds and caches. (setuptools
# builds in the source folder, and reuses the build/ it finds there, where a module
# since deleted from the tree would still be, and packed into the wheel.)
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "*.egg-info",
    "__pycache__",
    "test-artifacts",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
)


def _source_copy(base: Path) -> Path:
    """This tree as a fresh checkout has it, links kept (``engram/store`` is one)."""
    return Path(shutil.copytree(REPO, base / "source", symlinks=True, ignore=NOT_SOURCE))


def test_a_project_with_its_own_worker_jobs_and_web_enqueues_through_engram(
    installed: Path, tmp_path: Path, redis_url: str
) -> None:
    project = tmp_path / "project"
    for package in ("jobs", "web"):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text(f"MINE = {package!r}\n")
    (project / "worker.py").write_text("MINE = 'worker'\n")
    (project / "app.py").write_text(textwrap.dedent(APP))

    done = subprocess.run(
        [installed, "app.py", redis_url],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )

    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["mine"] == ["worker", "jobs", "web"]  # the project's own, not engram's
    assert out["engram"] == "engram.worker.producer"
    assert out["store"] == "engram.store.store" and out["scope"] == "engram.store.values"
    # The operation reached engram's streams.
    client = redis.Redis.from_url(redis_url)
    entries = [
        e for key in client.scan_iter(match=f"{keys.PREFIX}:ops:*") for e in client.xrange(key)
    ]
    assert [e for _, e in entries if out["operation_id"].encode() in b"".join(e.values())]


def test_the_installed_engram_holds_no_top_level_store_worker_jobs_or_web(
    installed: Path,
) -> None:
    site = installed.parent.parent / "lib"
    tops = {p.name for p in site.glob("python*/site-packages/*") if not p.name.endswith("-info")}
    assert {"engram"} <= tops
    assert not tops & {"store", "worker", "jobs", "web"}, tops
