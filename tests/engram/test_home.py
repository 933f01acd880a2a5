"""The home lock, process identity, and the supervisor's children, with real processes."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from engram.cleanup import clean_home
from engram.home import HomeInUseError, HomeLock, HomeSession, in_use_message
from engram.procs import ProcessRecord, live_process, wait_gone
from engram.supervisor import ChildSpec, Supervisor
from engram.worker.embedded import runfile
from tests.redis_fixtures import REPO, wait_until


@pytest.fixture
def reaped() -> Iterator[list[subprocess.Popen[bytes] | int]]:
    """Processes (or pids) a test started; each still running at the end is killed."""
    started: list[subprocess.Popen[bytes] | int] = []
    yield started
    for item in started:
        if isinstance(item, int):
            proc = live_process(item)
            if proc is not None:
                proc.kill()
        else:
            if item.poll() is None:
                item.kill()
            item.wait()
            if item.stdout is not None:
                item.stdout.close()


def _python(code: str, **kwargs: object) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
        [sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO, **kwargs
    )


def test_the_lock_names_its_holder_and_is_freed_when_the_holder_is_killed(
    tmp_path: Path, reaped: list[subprocess.Popen[bytes] | int]
) -> None:
    holder = _python(
        f"""
        import time
        from engram.home import HomeLock
        lock = HomeLock({str(tmp_path)!r})
        assert lock.acquire("engram test")
        print("held", flush=True)
        time.sleep(60)
        """,
        stdout=subprocess.PIPE,
    )
    reaped.append(holder)
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    lock = HomeLock(tmp_path)
    assert not lock.acquire("engram up")
    found = lock.holder()
    assert found is not None and found.pid == holder.pid and found.command == "engram test"
    assert found.alive()
    holder.kill()
    holder.wait()
    assert lock.acquire("engram up")  # the kernel released it
    assert lock.holder() is not None and lock.holder().pid == os.getpid()  # type: ignore[union-attr]
    lock.release()


def test_a_session_refuses_a_home_an_up_owns_and_waits_for_a_one_off_command(
    tmp_path: Path, reaped: list[subprocess.Popen[bytes] | int]
) -> None:
    for command, refused in (("engram up", True), ("engram demo", False)):
        holder = _python(
            f"""
            import time
            from engram.home import HomeLock
            import sys
            lock = HomeLock({str(tmp_path)!r})
            assert lock.acquire({command!r})
            print("held", flush=True)
            sys.stdin.read()  # held until the test closes our stdin
            """,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        reaped.append(holder)
        assert holder.stdin is not None and holder.stdout is not None
        assert holder.stdout.readline() == b"held\n"
        session = HomeSession(tmp_path, "engram up")
        if refused:
            with pytest.raises(HomeInUseError) as info:
                session.open()
            assert f"in use by engram up (pid {holder.pid})" in info.value.message
            assert holder.poll() is None  # refused at once, while the holder still ran
            holder.stdin.close()
        else:
            _waits_then_opens(session, holder)
        holder.wait()


def _waits_then_opens(session: HomeSession, holder: subprocess.Popen[bytes]) -> None:
    """``session.open`` waits while ``holder`` holds the home, and opens once it lets go."""
    opened = threading.Event()

    def open_it() -> None:
        session.open()
        opened.set()

    opener = threading.Thread(target=open_it)
    opener.start()
    # Waiting, not refused: the holder still holds the home (it waits for our word).
    assert not opened.wait(0.5) and opener.is_alive()
    assert holder.stdin is not None
    holder.stdin.close()  # the one-off command is done with the home
    opener.join(30)
    assert opened.is_set(), "the session opened once the holder let go"
    session.close()


def test_the_run_file_and_the_in_use_message_keep_the_redis_password_to_the_owner(
    tmp_path: Path,
) -> None:
    """The run file holds the Redis password: readable by its owner only, from the moment
    it exists; what a refused command prints masks the password."""
    old_umask = os.umask(0o022)  # a usual one: files come out 0644 unless made otherwise
    try:
        (tmp_path / "run.tmp").write_text("{}")  # a leftover of a killed writer, 0644
        with HomeSession(tmp_path, "engram up") as session:
            assert stat.S_IMODE((tmp_path / runfile.NAME).stat().st_mode) == 0o600
            session.publish(redis_url="redis://:s3cret@127.0.0.1:6390/0")
            assert stat.S_IMODE((tmp_path / runfile.NAME).stat().st_mode) == 0o600
            assert runfile.read_live(tmp_path) is not None
            message = in_use_message(tmp_path, None)
    finally:
        os.umask(old_umask)
    assert "redis://:***@127.0.0.1:6390/0" in message
    assert "s3cret" not in message


def test_a_record_never_names_a_process_that_merely_reuses_its_pid(
    reaped: list[subprocess.Popen[bytes] | int],
) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    reaped.append(sleeper)
    record = ProcessRecord.of("sleeper", sleeper.pid)
    assert record.process() is not None
    # The same pid with another start time: a process that came after ours died.
    impostor = ProcessRecord("sleeper", sleeper.pid, record.create_time - 100, signal.SIGTERM, 1.0)
    assert impostor.process() is None
    clean_home_records = [impostor.as_dict()]
    assert ProcessRecord.from_dict(clean_home_records[0]) == impostor


def test_cleaning_a_home_stops_what_its_run_file_names_and_nothing_else(
    tmp_path: Path, reaped: list[subprocess.Popen[bytes] | int]
) -> None:
    ours = subprocess.Popen(["sleep", "30"])
    not_ours = subprocess.Popen(["sleep", "30"])
    reaped += [ours, not_ours]
    mine = ProcessRecord.of("worker-0", ours.pid, stop_timeout_s=5)
    # A record of a dead process whose pid is now someone else's (another start time).
    stale = ProcessRecord("worker-1", not_ours.pid, mine.create_time - 100, signal.SIGTERM, 5)
    (tmp_path / runfile.NAME).write_text(
        json.dumps({"pid": 999_999_999, "processes": [mine.as_dict(), stale.as_dict()]})
    )
    assert runfile.read_live(tmp_path) is None  # its up is gone: clients do not use it
    clean_home(tmp_path)
    assert live_process(ours.pid) is None
    assert not_ours.poll() is None
    assert not (tmp_path / runfile.NAME).exists()


def test_children_die_with_a_supervisor_that_is_killed(
    tmp_path: Path, reaped: list[subprocess.Popen[bytes] | int]
) -> None:
    pids_file = tmp_path / "pids"
    supervisor = _python(
        f"""
        import time
        from engram.supervisor import ChildSpec, Supervisor
        children = Supervisor(
            [ChildSpec("a", ["sleep", "60"]), ChildSpec("b", ["sleep", "60"])], {{}}
        )
        children.start()
        open({str(pids_file)!r}, "w").write(" ".join(str(c.process.pid) for c in children.children))
        time.sleep(60)
        """
    )
    reaped.append(supervisor)
    pids = [
        int(p) for p in wait_until(lambda: pids_file.exists() and pids_file.read_text()).split()
    ]
    reaped += pids
    assert all(live_process(p) for p in pids)
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait()
    assert wait_gone(pids, timeout_s=5), "a child outlived its supervisor"


def test_a_child_that_exits_is_restarted_and_recorded(tmp_path: Path) -> None:
    started: list[ProcessRecord] = []
    children = Supervisor(
        [
            ChildSpec("short", ["true"], restart_pause_s=0.1),
            ChildSpec("once", ["true"], restart=False),
        ],
        {"PATH": os.environ["PATH"]},
        on_start=started.append,
    )
    children.start()
    first = children.children[0].process
    first.wait()
    children.children[1].process.wait()
    wait_until(lambda: (children.check(), children.children[0].process is not first)[1])
    assert [r.name for r in started].count("short") >= 2
    assert [r.name for r in started].count("once") == 1
    children.stop()
    assert children.children == []


def test_a_stopping_supervisor_kills_a_child_that_ignores_its_signal() -> None:
    children = Supervisor(
        [ChildSpec("stubborn", ["sh", "-c", "trap '' TERM; sleep 30"], stop_timeout_s=0.5)],
        {"PATH": os.environ["PATH"]},
    )
    children.start()
    pid = children.children[0].process.pid
    wait_until(lambda: psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    children.stop()
    assert live_process(pid) is None


def test_a_killed_owners_watchdog_stops_its_processes_and_holds_the_home_until_done(
    tmp_path: Path, reaped: list[subprocess.Popen[bytes] | int]
) -> None:
    owner = _python(
        f"""
        import signal, subprocess, time
        from engram.home import HomeSession
        from engram.procs import ProcessRecord
        session = HomeSession({str(tmp_path)!r}, "engram up").open()
        # A child that takes 2 s to give in to SIGKILL after ignoring SIGTERM.
        child = subprocess.Popen(
            ["sh", "-c", "trap '' TERM; echo trapped; sleep 60"],
            start_new_session=True,
            stdout=subprocess.PIPE,
        )
        assert child.stdout.readline().strip() == b"trapped"  # its trap is installed
        session.record(ProcessRecord.of("stubborn", child.pid, stop_timeout_s=2.0))
        print(child.pid, flush=True)
        time.sleep(60)
        """,
        stdout=subprocess.PIPE,
    )
    reaped.append(owner)
    assert owner.stdout is not None
    child = int(owner.stdout.readline())
    reaped.append(child)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    lock = HomeLock(tmp_path)
    assert not lock.acquire("engram up"), "the home was free while the watchdog still worked"
    assert lock.holder() is not None and not lock.holder().alive()  # type: ignore[union-attr]
    assert wait_gone([child], timeout_s=10)
    wait_until(lambda: lock.acquire("engram up"), timeout=10, what="the watchdog to finish")
    assert not (tmp_path / runfile.NAME).exists()
    lock.release()
