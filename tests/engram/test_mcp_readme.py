"""The README's MCP examples work as a client uses them: the ``mcp.json`` entry
``engram mcp --client-config`` prints starts a working server from anywhere, with
only its own environment (as a desktop client starts it: another folder, a bare
``PATH``, no virtual environment active), and the README's HTTP example survives a
write that answers ``queued``. (``tests/test_readme.py`` runs every example against a
real ``engram up`` too.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from engram.store import Store
from tests.mcp_support import TOOLS, ok, run, server_env
from tests.redis_fixtures import REPO, InProcessWorker
from tests.test_readme import blocks
from tests.web_fixtures import Served

SCOPE = {"user_id": "ada"}


def agents_section() -> str:
    text = (REPO / "README.md").read_text()
    return text[text.index("## Agents\n") : text.index("## The command line\n")]


def readme_mcp_json() -> dict[str, Any]:
    [block] = re.findall(r"^```json\n(.*?)^```$", agents_section(), re.M | re.S)
    config: dict[str, Any] = json.loads(block)
    return config


def client_config(cwd: Path, home: str) -> dict[str, Any]:
    """What ``engram mcp --scope ... --client-config`` prints, run in ``cwd``."""
    done = subprocess.run(
        [sys.executable, "-m", "engram", "mcp", "--scope", json.dumps(SCOPE), "--client-config"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "ENGRAM_HOME": home},
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    config: dict[str, Any] = json.loads(done.stdout)
    return config


def test_the_readme_mcp_json_is_what_client_config_prints(tmp_path: Path) -> None:
    shown = readme_mcp_json()["mcpServers"]["engram"]
    printed = client_config(tmp_path, ".engram")["mcpServers"]["engram"]
    assert set(shown) == set(printed) == {"command", "args", "env"}
    assert shown["args"] == printed["args"] == ["-m", "engram", "mcp", "--scope", shown["args"][4]]
    assert json.loads(shown["args"][4]) == json.loads(printed["args"][4]) == SCOPE
    # Absolute paths: this Python (its venv's, as is), and the home resolved where the
    # command ran, not wherever the client starts it.
    assert printed["command"] == sys.executable and Path(shown["command"]).is_absolute()
    assert printed["env"] == {"ENGRAM_HOME": str((tmp_path / ".engram").resolve())}
    assert Path(shown["env"]["ENGRAM_HOME"]).is_absolute()


@pytest.fixture
def worker(store: Store, start_worker: Callable[..., InProcessWorker]) -> Any:
    with start_worker(store) as running:
        yield running


def test_the_client_config_starts_a_working_server_from_anywhere(
    store: Store, dsn: str, redis_url: str, tmp_path: Path, worker: Any
) -> None:
    (tmp_path / "project").mkdir()
    (tmp_path / "elsewhere").mkdir()
    server = client_config(tmp_path / "project", ".engram")["mcpServers"]["engram"]
    # The entry's environment as printed, a bare PATH (no venv on it, no engram
    # command), started in another folder; the test's servers named outright (there is
    # no engram up on this home), and nothing else: no PYTHONPATH.
    servers = server_env(dsn, redis_url, tmp_path / "unused")
    env = {
        "PATH": "/usr/bin:/bin",
        **{k: servers[k] for k in ("DATABASE_URL", "REDIS_URL", "ENGRAM_EMBEDDER")},
        **{k: servers[k] for k in ("ENGRAM_PARTITIONS",)},
        **server["env"],
    }
    params = StdioServerParameters(
        command=server["command"], args=server["args"], env=env, cwd=tmp_path / "elsewhere"
    )

    async def main() -> None:
        with open(tmp_path / "mcp.log", "w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                assert tuple(t.name for t in (await session.list_tools()).tools) == TOOLS
                await ok(session, "remember", text="Ada reads the README.")
                found = await ok(session, "recall", query="Who reads the README?")
                assert [h["record"]["text"] for h in found["records"]] == ["Ada reads the README."]

    run(main)
    assert [r.text for r in store.records(SCOPE)] == ["Ada reads the README."]


def test_the_readme_http_example_survives_a_queued_write(
    store: Store, dsn: str, redis_url: str, tmp_path: Path, serve_web: Callable[..., Served]
) -> None:
    """No worker runs: the remember waits the server's whole ENGRAM_MCP_WAIT_S (5 s,
    the default) and answers queued. The example's client reads for longer, so it gets
    that answer (a read timeout equal to the wait ended in ReadTimeout)."""
    [example] = [
        b.code
        for b in blocks(agents_section())
        if b.language == "python" and "streamable_http_client" in b.code
    ]
    served = serve_web(
        database_url=dsn,
        redis_url=redis_url,
        env=server_env(dsn, redis_url, tmp_path / "home", ENGRAM_MCP_WAIT_S="5"),
    )
    secret, _ = store.tokens.create("ada-assistant", SCOPE, by="test")
    work = tmp_path / "work"
    (work / ".engram").mkdir(parents=True)
    (work / ".engram" / "run.json").write_text(json.dumps({"dashboard_url": served.url + "/"}))
    (work / "ada-token.json").write_text(json.dumps({"token": secret}))
    done = subprocess.run(
        [sys.executable, "-c", example], cwd=work, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == "queued"
