"""``engram up`` as installed, with no setting: only the operator is the operator. A
request without credentials reads nothing and mints nothing, a scoped token is only its
scope's, the operator signs in with the one-time link ``up`` printed to its terminal (or
one ``engram signin`` prints), programs send the home's token, the commands of the home
work as before, and every refused credential is a WARNING line and a count."""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from engram.store import Store
from tests.engram.test_up import Up, engram, home, start_up
from tests.redis_fixtures import wait_until

pytestmark = pytest.mark.slow

__all__ = ["home", "start_up"]  # the fixtures this module uses, from test_up

BOB = {"user_id": "bob"}
BOBS_TEXT = "Bob's diagnosis: seasonal flu."


def _signed_in(link: str, base_url: str) -> bool:
    """Whether following ``link`` in a fresh browser signs it in (and the page says so)."""
    with httpx.Client(timeout=30, follow_redirects=False) as browser:
        followed = browser.get(link)
        if followed.status_code != 303 or followed.headers["location"] != "/":
            return False
        return "signed in as <b>local</b>" in browser.get(base_url + "/").text


def test_on_the_default_install_leaving_the_token_out_is_no_one(
    home: Path, start_up: Callable[..., Up]
) -> None:
    up = start_up(home, terminal=True)
    run = up.wait_ready()
    url = str(run["dashboard_url"]).rstrip("/")
    token_file = home / "dashboard.token"
    operator_token = token_file.read_text().strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600

    # The commands of the home work as they did: they reach the servers, not the port.
    kept = engram(
        home,
        "enqueue",
        "remember",
        "--scope",
        json.dumps(BOB),
        "--request",
        json.dumps({"id": "bob-rec-1", "text": BOBS_TEXT}),
        "--wait",
        "30",
    )
    assert kept.returncode == 0, kept.stderr
    made = engram(home, "tokens", "create", "--name", "ada", "--scope", '{"user_id": "ada"}')
    assert made.returncode == 0, made.stderr
    ada = re.search(r"egt_[A-Za-z0-9_-]{43}", made.stdout)
    assert ada is not None, made.stdout
    as_ada = {"Authorization": f"Bearer {ada.group(0)}"}

    with httpx.Client(base_url=url, timeout=30, follow_redirects=False) as anyone:
        for path in ("/api/v1/scopes", "/api/v1/records/bob-rec-1", "/api/v1/receipts"):
            refused = anyone.get(path)
            assert refused.status_code == 401, path
            assert "flu" not in refused.text and refused.json()["error"]["code"] == "unauthorized"
        page = anyone.get("/records/bob-rec-1")
        assert page.status_code == 303 and page.headers["location"].startswith("/login?next=")
        assert "Sign in" in anyone.get("/login").text
        minted = anyone.post(
            "/tokens", data={"name": "eve", "scope": json.dumps(BOB), "can": "", "csrf": "x"}
        )
        assert minted.status_code == 401
        # A scoped token is its scope's, never the operator's.
        assert anyone.get("/api/v1/scopes", headers=as_ada).status_code == 403
        assert anyone.get("/tokens", headers=as_ada).status_code == 403
        theirs = anyone.get("/api/v1/records/bob-rec-1", headers=as_ada)
        assert theirs.status_code == 404 and "flu" not in theirs.text
        # The operator's programs send the home's token.
        mine = anyone.get("/api/v1/records/bob-rec-1", headers=_bearer(operator_token))
        assert mine.status_code == 200 and mine.json()["text"] == BOBS_TEXT
    listed = engram(home, "tokens", "list", "--json")
    assert [t["name"] for t in json.loads(listed.stdout)] == ["ada"]  # none minted
    with Store.connect(str(run["database_url"]), migrate=False) as store:
        # Nothing read by a token.
        assert store.tokens.reads_of_record({"user_id": "bob"}, "bob-rec-1") == []

    # The banner's link, printed to the terminal: it signs in once.
    printed = re.search(r"sign in\s+(http://\S+/login\?code=[A-Za-z0-9_-]+)", up.log())
    assert printed is not None, up.log()
    assert printed.group(1).startswith(url + "/login?code=")
    assert _signed_in(printed.group(1), url)
    assert not _signed_in(printed.group(1), url)
    # Another, from the command line.
    fresh = engram(home, "signin")
    assert fresh.returncode == 0, fresh.stderr
    assert _signed_in(fresh.stdout.strip(), url)
    assert not _signed_in(fresh.stdout.strip(), url)

    # Refused credentials leave a WARNING each and a count; never a secret.
    assert engram(home, "tokens", "revoke", "ada").returncode == 0
    assert httpx.get(url + "/api/v1/records/bob-rec-1", headers=as_ada).status_code == 401
    wait_until(
        lambda: "reason=revoked path=/api/v1/records/bob-rec-1 token=ada" in up.log(),
        what="the revoked token's refusal in up's log",
    )
    refusals = [line for line in up.log().splitlines() if "credentials refused" in line]
    assert all("WARNING" in line for line in refusals), refusals
    assert sum("door=api reason=missing" in line for line in refusals) == 3
    assert sum("door=dashboard reason=link" in line for line in refusals) == 2
    assert ada.group(0) not in up.log() and operator_token not in up.log()
    counted = httpx.get(url + "/metrics", headers=_bearer(operator_token), timeout=30).text
    assert 'engram_auth_refused_total{door="api",reason="missing"} 3' in counted
    assert 'engram_auth_refused_total{door="api",reason="revoked"} 1' in counted
    assert 'engram_auth_refused_total{door="dashboard",reason="link"} 2' in counted
    assert up.stop() == 0

    # The home keeps its token across restarts, as it keeps valkey's password.
    again = start_up(home)
    again.wait_ready()
    assert token_file.read_text().strip() == operator_token
    # Its output a file, not a terminal: no link in it, only how to get one.
    assert "/login?code=" not in again.log() and "`engram signin` prints" in again.log()
    assert again.stop() == 0


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
