"""The ``engram`` command: enqueue and wait, metrics, health, what goes to stdout and
stderr with which exit code. (``engram up`` itself: ``test_up.py``.)"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from engram import cli
from engram.cli import main
from engram.store import Store
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.redis_fixtures import FAST, REPO, InProcessWorker, wait_until

StartWorker = Callable[..., InProcessWorker]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, redis_url: str, tmp_path: Path) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(FAST.partitions))
    monkeypatch.setenv("ENGRAM_LEASE_TTL_MS", str(FAST.lease_ttl_ms))


@pytest.mark.usefixtures("env")
def test_enqueue_waits_and_prints_the_receipt(
    store: Store,
    start_worker: StartWorker,
    scope: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with start_worker(store):
        code = main(
            [
                "enqueue",
                "remember",
                "--scope",
                json.dumps(scope),
                "--request",
                '{"text": "Ada lives in London."}',
                "--operation-id",
                "cli:1",
                "--wait",
                "10",
            ]
        )
        assert code == 0
        receipt = json.loads(capsys.readouterr().out)
        assert receipt["operation_id"] == "cli:1" and receipt["scope_revision"] == 1
        assert receipt["records"][0]["status"] == "active"
        code = main(
            [
                "enqueue",
                "retract",
                "--scope",
                json.dumps(scope),
                "--request",
                '{"id": "mem_none"}',
                "--wait",
                "10",
            ]
        )
        assert code == 1
        assert json.loads(capsys.readouterr().out)["error"]["code"] == "not_found"
        assert main(["health"]) == 0
        assert json.loads(capsys.readouterr().out) == {
            "live_workers_on_this_host": 1,
            "stranded_entries": 0,
            "stranded_streams": [],
        }

        def committed_counted() -> bool:
            # Counters are written about once a second, or as soon as the worker idles.
            assert main(["metrics"]) == 0
            return "engram_ops_committed_total 1" in capsys.readouterr().out.splitlines()

        wait_until(committed_counted, timeout=5, what="the commit counted")


@pytest.mark.usefixtures("env")
def test_enqueue_without_wait_prints_where_it_went(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["enqueue", "forget", "--scope", '{"user_id": "ada"}', "--request", '{"id": "mem_1"}'])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["operation_id"].startswith("op_") and 0 <= out["partition"] < FAST.partitions
    assert out["entry"]


@pytest.mark.usefixtures("env")
def test_enqueue_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enqueue", "remember", "--scope", "{", "--request", "{}"]) == 2
    assert "must be JSON" in capsys.readouterr().err
    assert (
        main(["enqueue", "remember", "--scope", '{"user_id": "a"}', "--request", '{"text": ""}'])
        == 2
    )
    assert "invalid_request" in capsys.readouterr().err
    assert main(["health"]) == 1  # no worker running


def test_commands_say_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("REDIS_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path))
    assert main(["metrics"]) == 2
    assert "set REDIS_URL, or start `engram up`" in capsys.readouterr().err


def _enqueue(scope: dict[str, str], request: str, *extra: str) -> int:
    return main(["enqueue", "remember", "--scope", json.dumps(scope), "--request", request, *extra])


def _streams_empty(redis_client: redis.Redis) -> bool:
    return all(redis_client.xlen(f"engram:ops:{{{p}}}") == 0 for p in range(FAST.partitions))


@pytest.mark.usefixtures("env")
def test_text_with_no_utf8_form_is_refused_before_anything_is_sent(
    scope: dict[str, str], redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _enqueue(scope, '{"text": "Ada\'s secret \\ud800"}') == 2
    captured = capsys.readouterr()
    assert "invalid_request" in captured.err and captured.out == ""
    assert "surrogate" in captured.err and "secret" not in captured.err  # no memory text
    assert _streams_empty(redis_client)


@pytest.mark.usefixtures("env")
@pytest.mark.parametrize("wait", ["0", "-1", "nan", "soon"])
def test_a_wait_that_makes_no_sense_is_refused_before_anything_is_sent(
    wait: str, scope: dict[str, str], redis_client: redis.Redis
) -> None:
    with pytest.raises(SystemExit) as exited:
        _enqueue(scope, '{"text": "Never sent."}', "--wait", wait)
    assert exited.value.code == 2
    assert _streams_empty(redis_client)


@pytest.mark.usefixtures("env")
def test_a_wait_that_runs_out_is_not_a_failure_and_can_be_waited_again(
    store: Store,
    start_worker: StartWorker,
    scope: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = _enqueue(scope, '{"text": "Ada waits."}', "--operation-id", "cli:late", "--wait", "0.3")
    assert code == 3  # no worker yet
    captured = capsys.readouterr()
    pending = json.loads(captured.out)
    assert pending["operation_id"] == "cli:late" and pending["status"] == "pending"
    assert "error" not in pending
    scoped = json.dumps(scope, separators=(",", ":"))
    assert f"engram wait cli:late --scope '{scoped}'" in captured.err
    assert main(["wait", "cli:late", "--scope", scoped, "--timeout", "0.2"]) == 3
    capsys.readouterr()
    # An operation id is its scope's: another scope has no such operation.
    assert main(["wait", "cli:late", "--scope", '{"user_id":"bob"}', "--timeout", "0.2"]) == 3
    capsys.readouterr()
    with start_worker(store):
        assert main(["wait", "cli:late", "--scope", scoped, "--timeout", "10"]) == 0
    receipt = json.loads(capsys.readouterr().out)
    assert receipt["operation_id"] == "cli:late" and receipt["scope_revision"] == 1
    with pytest.raises(SystemExit) as exited:
        main(["wait", "cli:late", "--scope", scoped, "--timeout", "0"])
    assert exited.value.code == 2


@pytest.mark.usefixtures("env")
def test_a_request_can_come_from_a_file_or_stdin(
    store: Store,
    start_worker: StartWorker,
    scope: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Larger than one argument may be (128 kB on Linux): an extract of a long conversation.
    messages = [
        {"id": f"m{i}", "message": {"role": "user", "content": f"message {i} " + "x" * 1500}}
        for i in range(120)
    ]
    request = json.dumps({"messages": messages})
    assert len(request) > 131_072
    path = tmp_path / "request.json"
    path.write_text(request)
    (tmp_path / "scope.json").write_text(json.dumps(scope))
    with start_worker(store):
        code = main(
            [
                "enqueue",
                "extract",
                "--scope",
                f"@{tmp_path / 'scope.json'}",
                "--request",
                f"@{path}",
                "--wait",
                "20",
            ]
        )
        assert code == 0, capsys.readouterr().err
        assert len(json.loads(capsys.readouterr().out)["records"]) == 120
        monkeypatch.setattr(sys, "stdin", io.StringIO('{"text": "From stdin."}'))
        assert _enqueue(scope, "-", "--wait", "10") == 0
        assert json.loads(capsys.readouterr().out)["scope_revision"] == 2
    assert _enqueue(scope, f"@{tmp_path / 'missing.json'}") == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["enqueue", "forget", "--scope", "-", "--request", "-"]) == 2
    assert "only one" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"engram {declared}\n"


def test_help_speaks_to_the_user_not_of_the_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "versioned memory for AI agents" in out
    assert "_COMMAND_MODULES" not in out and "``" not in out


def test_the_command_table_names_the_module_of_every_command() -> None:
    """``engram <command>`` loads only the module its table names: a command missing
    from the table, or listed under another module, would not be found."""
    registered = {}
    for module in cli._COMMAND_MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        cli._register(module, sub)
        registered[module] = set(sub.choices)
    assert registered == {m: set(names) for m, names in cli._COMMAND_MODULES.items()}
    every = set(cli.build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert every == set(cli._MODULE_OF)
    for command in every:  # parsed with its module alone, as main parses it
        assert command in cli.build_parser(command)._subparsers._group_actions[0].choices  # type: ignore[union-attr]


def test_a_command_loads_only_what_it_runs() -> None:
    """``engram worker`` (twice in every ``engram up``) starts without the web app, the
    MCP server or an HTTP client (no model is configured): a fresh interpreter parses
    its command line and reads the settings, and none of them is loaded."""
    probe = (
        "import sys; from engram import cli; args = cli._parse(['--log-level', 'INFO', 'worker']);"
        " cli.Settings.from_env(); print(args.command, *sorted(m for m in sys.modules"
        " if m.startswith(('engram.web', 'engram.mcp', 'httpx'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True
    ).stdout
    assert out.split() == ["worker"]


def test_a_record_named_like_a_command_is_still_a_record(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Only the command word itself hands the rest of the line to valkey-cli.
    with pytest.raises(SystemExit):
        main(["get", "valkey-cli", "--bogus"])
    assert "engram get: error:" in capsys.readouterr().err
