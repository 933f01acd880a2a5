"""The forget ledger: every forget, and every token revocation, content-free, in files
outside the database it protects.

A backup taken before a forget still holds the forgotten text, and one taken before
a token's revocation still holds the token live; restoring it would bring either
back. The ledger outlives the database (it sits in a directory of its own, by
default ``ENGRAM_HOME/ledger``, or ``ENGRAM_FORGET_LEDGER_DIR``, which may be another
disk or a shared mount) and ``replay`` applies again, in any database, what it
lists (``ledger_replay``, docs/backups.md).

On disk: append-only JSON Lines, one file per kind and UTC day of appending
(``forgets-YYYY-MM-DD.jsonl``, ``revocations-YYYY-MM-DD.jsonl``). One line per
forget: the record id, its scope, the forget's operation id and when it committed;
one per revocation: the token's name and when it was created (which tells it from
a later token of the same name), who revoked it and when. Each line names its
database (``db``, ``database_key``: lines appended before there was one name none)
and carries a CRC-32 of its fields (``crc``); never anything of a text or a secret.
An append takes an exclusive ``flock`` on the day's file, first cuts a torn last
line (a writer killed mid-append) back to the last newline, then writes its lines
at once and fsyncs the file (and the directory, for a new file) before returning.
On read a line that does not parse or whose checksum is wrong is skipped and
counted (``scan``): the torn last line such a crash leaves is harmless, the next
append repairs it.

An entry's ``at`` is its forget's (or revocation's) commit time, never after the
day it was appended, so ``entries(since=…)`` skips the files of the days before
``since``.
"""

from __future__ import annotations

import fcntl
import hmac
import json
import logging
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, TypeVar

from .env import Env
from .errors import InvalidRequestError, LedgerUnavailableError
from .files import fsync_dir
from .values import Scope

log = logging.getLogger(__name__)

LEDGER_DIR_ENV = "ENGRAM_FORGET_LEDGER_DIR"
FORGETS = "forgets"
REVOCATIONS = "revocations"
_FILE = re.compile(r"^(forgets|revocations)-(\d{4}-\d{2}-\d{2})\.jsonl$")
_DATABASE = re.compile(r"[0-9a-f]{16}")


def database_key(conn: Any) -> str:
    """The name a ledger line gives its database: 16 hex digits, a keyed digest of the
    store's own secret (``engram_secrets``, migration 007). Every copy of a database
    has it (a base backup, a point in time, a ``pg_dump``), another database never
    does, and the digest tells nothing of the secret."""
    row = conn.execute("SELECT secret FROM engram_secrets WHERE name = 'request_digest'").fetchone()
    if row is None:
        raise LedgerUnavailableError("the store has no secret to name it by: run `engram migrate`")
    return hmac.new(bytes(row[0]), b"engram ledger database", "sha256").hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One forget, as the ledger keeps it: ids and a time, nothing of the text."""

    record_id: str
    scope: dict[str, str]
    operation_id: str
    at: datetime
    database: str | None = None  # ``database_key``; None in lines from before it

    def body(self) -> dict[str, Any]:
        body = {
            "at": self.at.astimezone(UTC).isoformat(),
            "id": self.record_id,
            "op": self.operation_id,
            "scope": dict(sorted(self.scope.items())),
        }
        return body if self.database is None else {**body, "db": self.database}

    def to_line(self) -> str:
        return _line(self.body())

    @classmethod
    def from_line(cls, line: str) -> LedgerEntry | None:
        """The entry a line holds; None for a torn or damaged line."""
        data = _checked(line, {"at", "id", "op", "scope"})
        try:
            if data is None or not isinstance(data["id"], str) or not isinstance(data["op"], str):
                return None
            scope = Scope.of(data["scope"]).as_dict()
        except (ValueError, TypeError, InvalidRequestError):
            return None
        return cls(data["id"], scope, data["op"], data["at"], data.get("db"))


@dataclass(frozen=True, slots=True)
class Revocation:
    """One token's revocation: its name and creation time (a later token may take the
    name of a revoked one after a restore to before it), who revoked it, and when."""

    token: str
    created_at: datetime
    by: str
    at: datetime
    database: str

    def body(self) -> dict[str, Any]:
        return {
            "at": self.at.astimezone(UTC).isoformat(),
            "by": self.by,
            "created": self.created_at.astimezone(UTC).isoformat(),
            "db": self.database,
            "token": self.token,
        }

    def to_line(self) -> str:
        return _line(self.body())

    @classmethod
    def from_line(cls, line: str) -> Revocation | None:
        data = _checked(line, {"at", "by", "created", "db", "token"})
        if data is None or "db" not in data:
            return None
        if not isinstance(data["token"], str) or not isinstance(data["by"], str):
            return None
        try:
            created = _utc(data["created"])
        except (ValueError, TypeError):
            return None
        if created is None:
            return None
        return cls(data["token"], created, data["by"], data["at"], data["db"])


def _line(body: Mapping[str, Any]) -> str:
    return json.dumps({**body, "crc": _crc(body)}, separators=(",", ":")) + "\n"


def _checked(line: str, fields: set[str]) -> dict[str, Any] | None:
    """A line's fields, its checksum right and its ``at`` (and ``db``, when there is
    one) read; None when it is not so."""
    try:
        data = json.loads(line)
        if not isinstance(data, dict):
            return None
        crc = data.pop("crc", None)
        if crc != _crc(data) or set(data) - {"db"} != fields - {"db"}:
            return None
        if "db" in data and not (isinstance(data["db"], str) and _DATABASE.fullmatch(data["db"])):
            return None
        data["at"] = _utc(data["at"])
    except (ValueError, TypeError):
        return None
    return data if data["at"] is not None else None


def _utc(text: Any) -> datetime | None:
    at = datetime.fromisoformat(text)
    return at if at.tzinfo is not None else None


def _crc(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return f"{zlib.crc32(canonical.encode()):08x}"


@dataclass(slots=True)
class Scan:
    """What reading the ledger found: its files, good entries, and damaged lines."""

    files: int = 0
    entries: int = 0
    damaged: int = 0
    damaged_at: list[str] = field(default_factory=list)  # "file:line", the first few


_E = TypeVar("_E", LedgerEntry, Revocation)


def default_dir(env: Mapping[str, str] | None = None) -> Path:
    """``ENGRAM_FORGET_LEDGER_DIR``, else ``ENGRAM_HOME/ledger`` (home: ``.engram``)."""
    read = Env(env)
    configured = read.optional(LEDGER_DIR_ENV)
    if configured:
        return Path(configured)
    return Path(read.text("ENGRAM_HOME", ".engram")) / "ledger"


class ForgetLedger:
    """An append-only, content-free record of forgets and revocations in ``directory``.

    With a ``mirror`` (``ENGRAM_BACKUP_DIR/ledger``), every append is made there too,
    after the ledger's own, as the server archives its WAL beside the base backups: the
    backups carry the ledger's lines, those appended since the last base backup
    included. The ledger is the truth: a mirror that cannot be written is logged and
    left behind (the next ``engram backup`` copies what it lacks, ``mirror_into``)."""

    def __init__(self, directory: Path | None = None, *, mirror: Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_dir()
        self.mirror = Path(mirror) if mirror is not None else None

    def __repr__(self) -> str:
        return f"ForgetLedger({str(self.directory)!r})"

    # -- writing ------------------------------------------------------------------

    def append(self, entries: Iterable[LedgerEntry | Revocation]) -> None:
        """Append ``entries`` (each to its kind's file of the day); durable (file and
        directory fsynced) when it returns."""
        lines: dict[str, list[str]] = {}
        for e in entries:
            lines.setdefault(REVOCATIONS if isinstance(e, Revocation) else FORGETS, []).append(
                e.to_line()
            )
        day = datetime.now(UTC).date().isoformat()
        for kind, text in lines.items():
            name, data = f"{kind}-{day}.jsonl", "".join(text).encode()
            try:
                _append_to(self.directory / name, data)
            except OSError as exc:
                raise LedgerUnavailableError(
                    f"the forget ledger at {self.directory} cannot be written: {exc.strerror}"
                ) from None
            if self.mirror is not None:
                try:
                    _append_to(self.mirror / name, data)
                except OSError as exc:
                    log.warning(
                        "the forget ledger's copy beside the backups was not appended to:"
                        " the next engram backup copies what it lacks",
                        extra={"mirror": str(self.mirror), "error": exc.strerror},
                    )

    # -- the copy beside the backups ------------------------------------------------

    def manifest(self) -> dict[str, int]:
        """How many lines each of the ledger's files holds: what a base backup records
        (``backup.json``'s ``ledger``), and what a ledger must hold to cover it."""
        found: dict[str, int] = {}
        for kind in (FORGETS, REVOCATIONS):
            for path in self.files(kind=kind):
                found[path.name] = _lines(path.read_bytes())
        return found

    def covers(self, manifest: Mapping[str, int]) -> bool:
        """Whether this ledger holds at least the lines ``manifest`` counted in each file:
        it is the one the backup was taken beside (or a copy of it), carried on."""
        if not self.directory.is_dir():
            return False
        for name, count in manifest.items():
            path = self.directory / name
            if not _FILE.match(name) or not path.is_file() or _lines(path.read_bytes()) < count:
                return False
        return True

    def mirror_into(self, other: Path) -> int:
        """Append to the ledger in ``other`` every line of this one it lacks (file by
        file, under each file's lock): a union, never a removal. Returns the lines added."""
        added = 0
        for kind in (FORGETS, REVOCATIONS):
            for path in self.files(kind=kind):
                target = Path(other) / path.name
                have = set(target.read_bytes().splitlines()) if target.is_file() else set()
                missing = [
                    line
                    for line in path.read_bytes().splitlines(keepends=True)
                    if line.endswith(b"\n") and line.rstrip(b"\n") not in have
                ]
                if missing:
                    _append_to(target, b"".join(missing))
                    added += len(missing)
        return added

    # -- reading ------------------------------------------------------------------

    def files(self, since: datetime | None = None, kind: str = FORGETS) -> list[Path]:
        """The ledger's files of ``kind``, oldest first (those of days before ``since``
        left out)."""
        if not self.directory.is_dir():
            return []
        if since is not None and since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        first = since.astimezone(UTC).date() if since is not None else date.min
        found = []
        for path in self.directory.iterdir():
            m = _FILE.match(path.name)
            if m and m.group(1) == kind and date.fromisoformat(m.group(2)) >= first:
                found.append(path)
        return sorted(found)

    def entries(
        self, since: datetime | None = None, scan: Scan | None = None
    ) -> Iterator[LedgerEntry]:
        """Every good forget entry, in the order appended (``at`` >= ``since`` only; a
        naive ``since`` is UTC); damaged lines are skipped, and counted in ``scan``."""
        for _, entry in self.located(since, scan):
            yield entry

    def located(
        self, since: datetime | None = None, scan: Scan | None = None
    ) -> Iterator[tuple[str, LedgerEntry]]:
        """``entries`` with where each is: ``file:line``, to report a line by."""
        return self._read(FORGETS, LedgerEntry.from_line, since, scan)

    def revocations(
        self, since: datetime | None = None, scan: Scan | None = None
    ) -> Iterator[tuple[str, Revocation]]:
        """Every good revocation with where it is, in the order appended."""
        return self._read(REVOCATIONS, Revocation.from_line, since, scan)

    def _read(
        self,
        kind: str,
        parse: Callable[[str], _E | None],
        since: datetime | None,
        scan: Scan | None,
    ) -> Iterator[tuple[str, _E]]:
        if since is not None and since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        for path in self.files(since, kind):
            if scan is not None:
                scan.files += 1
            with path.open("r", encoding="utf-8", errors="replace", newline="\n") as f:
                for number, line in enumerate(f, 1):
                    entry = parse(line) if line.endswith("\n") else None
                    if entry is None:
                        if line.strip():
                            _damaged(scan, path, number, torn=not line.endswith("\n"))
                        continue
                    if since is not None and entry.at < since:
                        continue
                    if scan is not None:
                        scan.entries += 1
                    yield f"{path.name}:{number}", entry

    def scan(self) -> Scan:
        """Read the whole ledger: how many files, good entries and damaged lines."""
        found = Scan()
        for _ in self.located(scan=found):
            pass
        for _ in self.revocations(scan=found):
            pass
        return found


def _append_to(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` under its lock (a torn last line cut first), fsynced,
    and its folder too when the file is new."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _cut_torn_tail(fd, path)
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)  # releases the lock
    if created:
        fsync_dir(path.parent)


def _lines(data: bytes) -> int:
    return data.count(b"\n")


def _damaged(scan: Scan | None, path: Path, number: int, *, torn: bool) -> None:
    if torn:  # a crash mid-append: the next append cuts it
        log.info("torn last line of the forget ledger skipped", extra={"file": path.name})
    else:
        log.warning("damaged forget ledger line skipped", extra={"file": path.name, "line": number})
    if scan is not None:
        scan.damaged += 1
        if len(scan.damaged_at) < 10:
            scan.damaged_at.append(f"{path.name}:{number}")


def _cut_torn_tail(fd: int, path: Path) -> None:
    """Cut what follows the last newline (a line torn by a crash mid-append)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    with path.open("rb") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        # Look back in blocks for the last newline; none: the whole file is torn.
        end = size
        keep = 0
        while end > 0:
            start = max(0, end - 65536)
            f.seek(start)
            block = f.read(end - start)
            cut = block.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            end = start
    os.ftruncate(fd, keep)
    log.warning("torn last line of the forget ledger cut", extra={"file": path.name})


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
