"""The README's examples, run as written: every ``sh`` and ``python`` block, in order
(each ``python`` block twice), against a real ``engram up`` started by the README's
own block, in a fresh folder with the default home, with no URL configured.

A block that is not meant to run carries ``<!-- readme-test: skip (why) -->`` on the
line above it; ``<!-- readme-test: background (why) -->`` runs it in the background
(``engram up``) until the end, once it has published its servers.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engram.cleanup import clean_home
from engram.worker.embedded import runfile
from tests.redis_fixtures import REPO, wait_until

README = REPO / "README.md"
RUNNABLE = ("sh", "python")
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_MARK = re.compile(r"^<!-- readme-test: (\w+)(?: \(([^)]*)\))? -->$", re.M)


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    line: int
    mark: str | None  # skip, background, or None: run it

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.language})"


def blocks(text: str) -> list[Block]:
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip().rsplit("\n", 1)[-1]
        mark = _MARK.fullmatch(before)
        found.append(
            Block(
                language=match.group(1),
                code=match.group(2),
                line=text.count("\n", 0, match.start()) + 1,
                mark=mark.group(1) if mark else None,
            )
        )
    return found


def test_every_mark_is_known_and_says_why() -> None:
    text = README.read_text()
    for mark in _MARK.finditer(text):
        assert mark.group(1) in ("skip", "background"), mark.group(0)
        assert mark.group(2), f"{mark.group(0)} says no why"
    runnable = [b for b in blocks(text) if b.language in RUNNABLE and b.mark != "skip"]
    assert {b.language for b in runnable} == set(RUNNABLE)
    assert len([b for b in blocks(text) if b.mark is not None]) == len(list(_MARK.finditer(text)))


def test_no_example_assumes_the_dashboard_port() -> None:
    """``up`` serves on a free port when 8700 is taken: an example that reaches the
    dashboard reads its URL from the run file (``dashboard_url``), as the README says."""
    text = README.read_text()
    runnable = [b for b in blocks(text) if b.language in RUNNABLE and b.mark != "skip"]
    assert [str(b) for b in runnable if ":8700" in b.code] == []
    reaching = [b for b in runnable if "curl" in b.code or "streamable_http_client" in b.code]
    assert reaching and all("dashboard_url" in b.code for b in reaching)
    assert "`dashboard_url`" in text  # and the prose says where to read it


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A fresh folder outside pytest's (the embedded PostgreSQL runs as another user),
    with an ``engram`` command on the PATH that runs this checkout."""
    base = Path(tempfile.mkdtemp(prefix="engram-readme-"))
    (base / "bin").mkdir()
    shim = base / "bin" / "engram"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m engram "$@"\n')
    shim.chmod(0o755)
    (base / "work").mkdir()
    yield base / "work"
    if (base / "work" / ".engram").exists():
        clean_home(base / "work" / ".engram")  # a last resort, should up fail to stop
    shutil.rmtree(base, ignore_errors=True)


def _env(workdir: Path) -> dict[str, str]:
    unset = ("DATABASE_URL", "REDIS_URL", "ENGRAM_HOME", "ENGRAM_EMBEDDER", "ENGRAM_PARTITIONS")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["PATH"] = f"{workdir.parent / 'bin'}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(REPO)
    return env


def _run(block: Block, workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = (
        [sys.executable, "-c", block.code]
        if block.language == "python"
        else ["bash", "-euo", "pipefail", "-c", block.code]
    )
    return subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
# Every example against a real engram up, some starting servers of their own (the MCP
# ones): over the suite's 5 minutes on a loaded 2-core machine (325 s measured).
@pytest.mark.timeout(900)
def test_the_readme_examples_work_as_written(workdir: Path) -> None:
    env = _env(workdir)
    background: list[subprocess.Popen[bytes]] = []
    ran = 0
    try:
        for block in blocks(README.read_text()):
            if block.language not in RUNNABLE or block.mark == "skip":
                continue
            if block.mark == "background":
                log = open(workdir.parent / f"background-{block.line}.log", "wb")  # noqa: SIM115
                background.append(
                    subprocess.Popen(
                        ["bash", "-c", block.code],
                        cwd=workdir,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
                log.close()
                wait_until(
                    lambda: (
                        (runfile.read_live(workdir / ".engram") or {}).get("redis_url")
                        or background[-1].poll() is not None
                    ),
                    timeout=120,
                    what=f"{block} to start",
                )
                assert background[-1].poll() is None, f"{block} exited"
                continue
            # A Python example is run twice: a reader runs it again, and an example
            # with operation ids shows they make it safe to.
            for _ in range(2 if block.language == "python" else 1):
                done = _run(block, workdir, env)
                assert done.returncode == 0, f"{block} failed:\n{done.stdout}\n{done.stderr}"
            ran += 1
    finally:
        for process in background:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert ran >= 5
    assert [p.returncode for p in background] == [0] * len(background)


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors for a document's headings."""
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", markdown, re.M)
    }


@pytest.mark.parametrize(
    "doc", ["README.md", *(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]
)
def test_every_link_between_the_docs_leads_somewhere(doc: str) -> None:
    text = (REPO / doc).read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        file = (REPO / doc).parent / path if path else REPO / doc
        assert file.exists(), f"{doc} links to {target}: no such file"
        if anchor and file.suffix == ".md":
            assert anchor in _anchors(file.read_text()), f"{doc} links to {target}: no such heading"


PRODUCT_PACKAGES = ("store", "worker", "jobs", "web", "engram")
SETTING = re.compile(r"""["'](ENGRAM_[A-Z0-9_]+|DATABASE_URL|REDIS_URL)["']""")


def test_every_setting_the_product_reads_is_in_the_readme_configuration() -> None:
    """A user learns what can be set from the README's table, not from the code."""
    read: set[str] = set()
    for package in PRODUCT_PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            read |= set(SETTING.findall(path.read_text()))
    text = README.read_text()
    section = text[text.index("## Configuration\n") : text.index("## From Python\n")]
    listed = set(re.findall(r"`(ENGRAM_[A-Z0-9_]+|DATABASE_URL|REDIS_URL)`", section))
    assert read, "no setting found: the scan is broken"
    assert sorted(read - listed) == []
