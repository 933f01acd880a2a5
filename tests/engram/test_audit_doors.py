"""Every operator action, from every door it has (the CLI, the dashboard, the API),
writes an audit row with who asked and why: one case a row of the table below.

The CLI's who is ``--by``, the dashboard's and the API's the operator signed in
(``local`` on loopback); the why is ``--reason``, the form's Why box or the body's
``reason``. Each case finds its row by the why it gave, unique to it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
from rq import Queue
from starlette.testclient import TestClient

from engram.cli import main
from engram.jobs.keys import MAINTENANCE_QUEUE
from engram.jobs.queues import SERIALIZER
from engram.store import Store
from engram.store.errors import InvalidRequestError
from engram.worker.admin import deadletters, pause
from engram.worker.embedded.runtime import connect_redis
from engram.worker.protocol import partition_of
from tests.cli_support import logging_restored  # noqa: F401 (an autouse fixture)
from tests.redis_fixtures import FAST
from tests.rq_jobs import enqueue_failing, work
from tests.web_fixtures import BASE_URL, EMBEDDER, make_app, sign_in

CLI_WHO = "ops:grace"
WEB_WHO = "local"  # the operator on loopback, without a token


@dataclass
class Doors:
    store: Store
    redis: redis.Redis
    redis_url: str
    http: TestClient
    capsys: pytest.CaptureFixture[str]

    def cli(self, *argv: str) -> str:
        code = main(list(argv))
        captured = self.capsys.readouterr()
        assert code == 0, captured.err
        return captured.out

    def form(self, path: str, **data: str) -> None:
        html = self.http.get("/tokens").text  # any page: the session's CSRF token
        marker = 'name="csrf" value="'
        start = html.index(marker) + len(marker)
        token = html[start : html.index('"', start)]
        answer = self.http.post(path, data={"csrf": token, **data})
        # A redirect once done, a created page, or (a bulk action) the page saying what
        # was done; a refusal would re-render its form with a 4xx.
        assert answer.status_code in (200, 201, 303), answer.text

    def api(self, method: str, path: str, body: dict[str, object]) -> dict[str, object]:
        answer = self.http.request(method, path, json=body)
        assert answer.status_code in (200, 202, 204), answer.text
        return answer.json() if answer.content else {}


@pytest.fixture
def doors(
    fresh_store: Store,
    fresh_dsn: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: object,
) -> Iterator[Doors]:
    monkeypatch.setenv("DATABASE_URL", fresh_dsn)
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("ENGRAM_PARTITIONS", str(FAST.partitions))
    monkeypatch.setenv("ENGRAM_LEASE_TTL_MS", str(FAST.lease_ttl_ms))
    monkeypatch.delenv("ENGRAM_JOBS_REDIS_URL", raising=False)
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path))
    client = connect_redis(redis_url)
    app = make_app(fresh_store, client, start_reembed=lambda model, who: "reembed-web")
    with TestClient(app, base_url=BASE_URL, follow_redirects=False) as http:
        sign_in(http, "local")
        yield Doors(fresh_store, client, redis_url, http, capsys)
    client.close()


# -- what some actions need first --------------------------------------------------------


def a_letter(d: Doors) -> str:
    """A dead letter holding a valid forget, on its scope's partition."""
    scope = {"user_id": "dead"}
    op = json.dumps(
        {"operation_id": "op:dead", "kind": "forget", "scope": scope, "request": {"id": "mem_x"}}
    )
    pipe = d.redis.pipeline()
    deadletters.add(
        pipe,
        partition=partition_of(scope, FAST.partitions),
        entry_id="1-1",
        operation_id="op:dead",
        raw=op,
        reason=deadletters.MALFORMED,
        error=InvalidRequestError("bad"),
        deliveries=1,
    )
    return str(pipe.execute()[0].decode())


def a_failed_job(d: Doors) -> str:
    queue = Queue(MAINTENANCE_QUEUE, connection=d.redis, serializer=SERIALIZER)
    job = enqueue_failing(queue, "mem_doors")
    work(d.store, d.redis_url, d.redis, queue)
    return str(job.id)


def a_pending_generation(d: Doors) -> str:
    return str(d.store.embeddings.begin("hashing-24", 24).id)


def a_record(d: Doors) -> str:
    mem = d.store.session({"user_id": "ada"}, embedder=EMBEDDER)
    return mem.remember("Ada keeps bees.").records[0].id


def a_token(d: Doors) -> str:
    d.store.tokens.create("agent-doors", {"user_id": "ada"}, by="setup")
    return "agent-doors"


def paused_partition(d: Doors) -> str:
    pause.pause_partition(d.redis, 1, pause.Pause.now("setup"))
    return "1"


def paused_jobs(d: Doors) -> str:
    pause.pause_jobs(d.redis, pause.Pause.now("setup"))
    return "jobs"


def nothing(d: Doors) -> str:
    return ""


def bulk_cli(d: Doors, why: str) -> None:
    dry = json.loads(d.cli("dead-letters", "discard", "--all", "--filter-reason", "malformed"))
    d.cli(
        "dead-letters", "discard", "--all", "--filter-reason", "malformed",
        "--confirm", dry["confirm"], "--by", CLI_WHO, "--reason", why,
    )  # fmt: skip


def bulk_form(d: Doors, why: str) -> None:
    # The count and digest the dashboard's dry-run page puts in its confirm form.
    dry = d.api("POST", "/api/v1/bulk/dead-letters", {"action": "discard"})
    count, digest = str(dry["count"]), str(dry["digest"])
    d.form("/dead-letters/bulk", action="discard", count=count, digest=digest, why=why)


def bulk_api(d: Doors, why: str) -> None:
    ask = {"action": "discard", "filter": {"reason": "malformed"}}
    dry = d.api("POST", "/api/v1/bulk/dead-letters", ask)
    d.api("POST", "/api/v1/bulk/dead-letters", {**ask, "confirm": dry["confirm"], "reason": why})


Act = Callable[[Doors, str, str], None]  # the doors, the setup's target, the why

CASES: list[tuple[str, str, Callable[[Doors], str], Act]] = [
    # (action, door, setup, act)
    ("partition.pause", "cli", nothing,
     lambda d, t, why: d.cli("pause", "partition", "1", "--by", CLI_WHO, "--reason", why)),
    ("partition.pause", "dashboard", nothing,
     lambda d, t, why: d.form("/pause/partition", partition="1", reason=why)),
    ("partition.pause", "api", nothing,
     lambda d, t, why: d.api("POST", "/api/v1/partitions/1/pause", {"reason": why})),
    ("partition.resume", "cli", paused_partition,
     lambda d, t, why: d.cli("resume", "partition", t, "--by", CLI_WHO, "--reason", why)),
    ("partition.resume", "dashboard", paused_partition,
     lambda d, t, why: d.form(f"/resume/partition/{t}", reason=why)),
    ("partition.resume", "api", paused_partition,
     lambda d, t, why: d.api("POST", f"/api/v1/partitions/{t}/resume", {"reason": why})),
    ("jobs.pause", "cli", nothing,
     lambda d, t, why: d.cli("pause", "jobs", "--by", CLI_WHO, "--reason", why)),
    ("jobs.pause", "dashboard", nothing,
     lambda d, t, why: d.form("/pause/jobs", reason=why)),
    ("jobs.pause", "api", nothing,
     lambda d, t, why: d.api("POST", "/api/v1/queues/pause", {"reason": why})),
    ("jobs.resume", "cli", paused_jobs,
     lambda d, t, why: d.cli("resume", "jobs", "--by", CLI_WHO, "--reason", why)),
    ("jobs.resume", "dashboard", paused_jobs,
     lambda d, t, why: d.form("/resume/jobs", reason=why)),
    ("jobs.resume", "api", paused_jobs,
     lambda d, t, why: d.api("POST", "/api/v1/queues/resume", {"reason": why})),
    ("reembed.start", "cli", nothing,
     lambda d, t, why: d.cli(
         "reembed", "--model", "hashing:16", "--detach", "--by", CLI_WHO, "--reason", why)),
    ("reembed.start", "dashboard", nothing,
     lambda d, t, why: d.form("/generations/reembed", model="hashing:16", why=why, confirm="yes")),
    ("reembed.start", "api", nothing,
     lambda d, t, why: d.api("POST", "/api/v1/reembed", {"model": "hashing:16", "reason": why})),
    ("reembed.cancel", "cli", a_pending_generation,
     lambda d, t, why: d.cli("reembed", "--cancel", t, "--by", CLI_WHO, "--reason", why)),
    ("reembed.cancel", "dashboard", a_pending_generation,
     lambda d, t, why: d.form(f"/generations/{t}/cancel", why=why)),
    ("reembed.cancel", "api", a_pending_generation,
     lambda d, t, why: d.api("POST", f"/api/v1/generations/{t}/cancel", {"reason": why})),
    ("dead_letter.retry", "cli", a_letter,
     lambda d, t, why: d.cli("dead-letters", "retry", t, "--by", CLI_WHO, "--reason", why)),
    ("dead_letter.retry", "dashboard", a_letter,
     lambda d, t, why: d.form(f"/dead-letters/{t}/retry", why=why)),
    ("dead_letter.retry", "api", a_letter,
     lambda d, t, why: d.api("POST", f"/api/v1/dead-letters/{t}/retry", {"reason": why})),
    ("dead_letter.discard", "cli", a_letter,
     lambda d, t, why: d.cli("dead-letters", "discard", t, "--by", CLI_WHO, "--reason", why)),
    ("dead_letter.discard", "dashboard", a_letter,
     lambda d, t, why: d.form(f"/dead-letters/{t}/discard", why=why)),
    ("dead_letter.discard", "api", a_letter,
     lambda d, t, why: d.api("DELETE", f"/api/v1/dead-letters/{t}", {"reason": why})),
    ("dead_letter.discard", "cli bulk", a_letter, lambda d, t, why: bulk_cli(d, why)),
    ("dead_letter.discard", "dashboard bulk", a_letter, lambda d, t, why: bulk_form(d, why)),
    ("dead_letter.discard", "api bulk", a_letter, lambda d, t, why: bulk_api(d, why)),
    ("job.retry", "dashboard", a_failed_job,
     lambda d, t, why: d.form(f"/jobs/{t}/retry", why=why)),
    ("job.retry", "api", a_failed_job,
     lambda d, t, why: d.api("POST", f"/api/v1/jobs/{t}/retry", {"reason": why})),
    ("job.discard", "dashboard", a_failed_job,
     lambda d, t, why: d.form(f"/jobs/{t}/discard", why=why)),
    ("job.discard", "api", a_failed_job,
     lambda d, t, why: d.api("POST", f"/api/v1/jobs/{t}/discard", {"reason": why})),
    ("record.forget", "dashboard", a_record,
     lambda d, t, why: d.form(f"/forget/{t}", why=why)),
    ("record.forget", "api", a_record,
     lambda d, t, why: d.api("POST", "/api/v1/operations", {
         "kind": "forget", "scope": {"user_id": "ada"}, "request": {"id": t}, "reason": why})),
    ("layout.repartition", "cli", nothing,
     lambda d, t, why: d.cli("repartition", "2", "--no-wait", "--by", CLI_WHO, "--reason", why)),
    ("token.create", "cli", nothing,
     lambda d, t, why: d.cli(
         "tokens", "create", "--scope", '{"user_id": "ada"}', "--name", "agent-cli",
         "--by", CLI_WHO, "--reason", why)),
    ("token.create", "dashboard", nothing,
     lambda d, t, why: d.form(
         "/tokens", name="agent-web", scope='{"user_id": "ada"}', can_recall="on", why=why)),
    ("token.revoke", "cli", a_token,
     lambda d, t, why: d.cli("tokens", "revoke", t, "--by", CLI_WHO, "--reason", why)),
    ("token.revoke", "dashboard", a_token,
     lambda d, t, why: d.form(f"/tokens/{t}/revoke", why=why)),
    ("prune.run", "cli", nothing,
     lambda d, t, why: d.cli(
         "prune", "dead-letters", "--older-than", "1d", "--by", CLI_WHO, "--reason", why)),
    ("prune.run", "cli enqueue", nothing,
     lambda d, t, why: d.cli(
         "prune", "dead-letters", "--enqueue", "--by", CLI_WHO, "--reason", why)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("action", "door", "setup", "act"),
    CASES,
    ids=[f"{action}-{door}".replace(" ", "-") for action, door, _, _ in CASES],
)
def test_each_action_from_each_door_writes_who_and_why(
    doors: Doors, action: str, door: str, setup: Callable[[Doors], str], act: Act
) -> None:
    target = setup(doors)
    why = f"because of {action} by the {door}"
    act(doors, target, why)
    rows = [e for e in doors.store.audit.page(limit=50).items if e.detail.get("reason") == why]
    assert [e.action for e in rows] == [action], rows
    assert rows[0].requested_by == (CLI_WHO if door.startswith("cli") else WEB_WHO)


def test_every_audited_action_has_a_door_in_the_table() -> None:
    from engram.store.audit import ACTIONS

    # engram restore's row works on a home's embedded database alone, never DATABASE_URL's:
    # tests/engram/test_backup_restore.py reads it after a restore.
    assert {action for action, *_ in CASES} == set(ACTIONS) - {"database.restore"}


def test_the_overview_offers_a_why_for_each_pause_and_resume(doors: Doors) -> None:
    """The dashboard's door has a Why box on each form, not only on the partition's."""
    pause.pause_partition(doors.redis, 1, pause.Pause.now("setup"))
    html = doors.http.get("/").text
    for action in ("/pause/partition", "/pause/jobs", "/resume/partition/1"):
        form = html[html.index(f'action="{action}"') :]
        assert 'name="reason"' in form[: form.index("</form>")], action
    pause.pause_jobs(doors.redis, pause.Pause.now("setup"))
    html = doors.http.get("/").text
    form = html[html.index('action="/resume/jobs"') :]
    assert 'name="reason"' in form[: form.index("</form>")]
