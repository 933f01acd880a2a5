"""docker-compose.yml cannot run here (no Docker engine): check its shape instead."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.redis_fixtures import REPO

COMPOSE = REPO / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def test_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", "redis", "migrate", "worker", "jobs", "web"}
    assert set(compose["volumes"]) == {"postgres-data", "redis-data"}


def test_servers_have_health_checks_and_durable_storage(compose: dict[str, Any]) -> None:
    pg, redis = compose["services"]["postgres"], compose["services"]["redis"]
    assert pg["image"].startswith("pgvector/pgvector:")
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in pg["volumes"])
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] in ("always", "everysec")
    assert "ping" in redis["healthcheck"]["test"]
    assert any(v.endswith(":/data") for v in redis["volumes"])


def test_engram_services_are_configured_by_url(compose: dict[str, Any]) -> None:
    for name in ("migrate", "worker", "jobs", "web"):
        service = compose["services"][name]
        env = service["environment"]
        assert (
            env["DATABASE_URL"].startswith("postgresql://")
            and "@postgres:5432/" in env["DATABASE_URL"]
        )
        assert env["REDIS_URL"].startswith("redis://redis:6379/")
        assert service["command"][0] == "engram"
    assert compose["services"]["migrate"]["command"] == ["engram", "migrate"]
    assert compose["services"]["migrate"]["restart"] == "no"


def test_workers_start_after_a_healthy_database_and_a_finished_migration(
    compose: dict[str, Any],
) -> None:
    worker = compose["services"]["worker"]
    assert worker["command"] == ["engram", "worker"]
    assert worker["deploy"]["replicas"] >= 2
    assert worker["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "redis": {"condition": "service_healthy"},
        "migrate": {"condition": "service_completed_successfully"},
    }
    assert worker["healthcheck"]["test"] == ["CMD", "engram", "health"]
    assert worker["stop_signal"] == "SIGTERM"
    assert compose["services"]["migrate"]["depends_on"] == {
        "postgres": {"condition": "service_healthy"}
    }


def test_every_long_running_service_has_a_health_check(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        if service.get("restart") != "no":
            assert "healthcheck" in service, name


def test_the_dashboard_needs_its_token_and_is_checked_on_healthz(compose: dict[str, Any]) -> None:
    web = compose["services"]["web"]
    assert web["command"][:2] == ["engram", "web"]
    host = web["command"][web["command"].index("--host") + 1]
    # Off loopback engram web refuses to start without a token; compose refuses first.
    assert host == "0.0.0.0"
    assert web["environment"]["ENGRAM_DASHBOARD_TOKEN"].startswith("${ENGRAM_DASHBOARD_TOKEN:?")
    assert (
        web["environment"]["DATABASE_URL"]
        == compose["services"]["worker"]["environment"]["DATABASE_URL"]
    )
    assert all(p.startswith("127.0.0.1:") for p in web["ports"])
    check = " ".join(web["healthcheck"]["test"])
    assert "/healthz" in check and ":8700" in check
    assert web["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    assert web["depends_on"]["postgres"] == {"condition": "service_healthy"}


def test_the_jobs_worker_runs_after_the_migration_with_its_own_health_check(
    compose: dict[str, Any],
) -> None:
    jobs = compose["services"]["jobs"]
    assert jobs["command"] == ["engram", "jobs"]
    assert jobs["healthcheck"]["test"] == ["CMD", "engram", "jobs-health"]
    assert jobs["stop_signal"] == "SIGTERM"
    assert jobs["restart"] == "unless-stopped"
    assert jobs["depends_on"] == compose["services"]["worker"]["depends_on"]
