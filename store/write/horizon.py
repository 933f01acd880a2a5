"""What keeps a forget's deleted row versions from VACUUM: the holders of the xmin horizon.

VACUUM removes a deleted row version only once no snapshot anywhere may still read
it: once the oldest xmin horizon of the database has passed the transaction that
deleted it. ``holders`` names what holds that horizon before a limit (the next
transaction id when a redaction began: every forget committed by then has an older
one), content-free, in the words an operator acts on:

- a transaction of this database (its snapshot's xmin, or its own id) — seen in
  ``pg_stat_activity``;
- a walsender (not connected to any database: ``datname`` is NULL): a standby with
  ``hot_standby_feedback = on`` reports the oldest snapshot of its queries, and its
  walsender holds it for every database of the primary;
- a replication slot's ``xmin``: a standby streaming through a slot reports its
  feedback there, and the slot keeps it while that standby is away (for good, if it
  never returns). A slot's ``catalog_xmin`` holds the system catalogs only, not
  engram's tables;
- a prepared transaction of this database (two-phase commit: no backend, not in
  ``pg_stat_activity``).

Other databases' transactions do not hold this database's tables. Transaction ids
wrap around: they are compared by their ``age()``, taken in one statement.

``pg_stat_activity`` shows another role's snapshots only to a superuser or a member
of ``pg_read_all_stats``: engram's role needs that to see them (``docs/jobs.md``).
"""

from __future__ import annotations

from typing import Any

# Holders, each a row (kind, name, detail), older than the limit ``%(limit)s`` (xid8).
_HOLDERS = """
WITH lim AS (SELECT age(xid(%(limit)s::xid8)) AS age)
SELECT CASE WHEN a.backend_type = 'walsender' THEN 'walsender' ELSE 'backend' END,
       a.pid::text, a.backend_type
  FROM pg_stat_activity a, lim
 WHERE a.pid <> pg_backend_pid()
   AND (a.datname = current_database() OR a.backend_type = 'walsender')
   AND (age(a.backend_xmin) > lim.age OR age(a.backend_xid) > lim.age)
UNION ALL
SELECT 'slot', s.slot_name::text, s.slot_type || CASE WHEN s.active THEN '' ELSE ', inactive' END
  FROM pg_replication_slots s, lim
 WHERE age(s.xmin) > lim.age
UNION ALL
SELECT 'prepared', p.gid, NULL
  FROM pg_prepared_xacts p, lim
 WHERE p.database = current_database() AND age(p.transaction) > lim.age
"""

# A prepared transaction's name is the client's choice: never quoted at length.
_NAME_CHARS = 64


def limit(conn: Any) -> int:
    """The next transaction id, now (``xid8``): every transaction committed by now,
    every forget among them, has a lower one."""
    row = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
    assert row is not None
    return int(row[0])


def holders(conn: Any, before: int) -> list[str]:
    """What holds the xmin horizon before the transaction id ``before`` (from
    ``limit``): the row versions deleted by a transaction older than it may still be
    read, so VACUUM keeps them. Empty once nothing does."""
    rows = conn.execute(_HOLDERS, {"limit": str(before)}).fetchall()
    return [describe(kind, name, detail) for kind, name, detail in rows]


def describe(kind: str, name: str, detail: str | None) -> str:
    """One holder, as an operator finds it again (``pid``, slot or transaction name)."""
    if kind == "walsender":
        return f"a standby's snapshot (hot_standby_feedback) via walsender pid {name}"
    if kind == "slot":
        return f"replication slot {_quoted(name)} ({detail})"
    if kind == "prepared":
        return f"prepared transaction {_quoted(name)}"
    return f"an open transaction of pid {name} ({detail})"


def _quoted(name: str) -> str:
    short = name if len(name) <= _NAME_CHARS else name[: _NAME_CHARS - 1] + "…"
    return "'" + short.replace("'", "''") + "'"
