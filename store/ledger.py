"""The forget ledger: every forget, content-free, in files outside the database it protects.

A backup taken before a forget still holds the forgotten text; restoring it would
bring the text back. The ledger outlives the database (it sits in a directory of its
own, by default ``ENGRAM_HOME/ledger``, or ``ENGRAM_FORGET_LEDGER_DIR``, which may be
another disk or a shared mount) and ``replay`` forgets again, in any database, what
it lists (docs/backups.md).

On disk: append-only JSON Lines, one file per UTC day of appending
(``forgets-YYYY-MM-DD.jsonl``). One line per forget: the record id, its scope, the
forget's operation id and when it committed, and a CRC-32 of those (``crc``), never
anything of the text. An append takes an exclusive ``flock`` on the day's file,
first cuts a torn last line (a writer killed mid-append) back to the last newline,
then writes its lines at once and fsyncs the file (and the directory, for a new
file) before returning. On read a line that does not parse or whose checksum is
wrong is skipped and counted (``scan``): the torn last line such a crash leaves is
harmless, the next append repairs it.

An entry's ``at`` is its forget's commit time, never after the day it was appended,
so ``entries(since=…)`` skips the files of the days before ``since``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from .env import Env
from .errors import InvalidRequestError, LedgerUnavailableError
from .files import fsync_dir
from .values import Scope

log = logging.getLogger(__name__)

LEDGER_DIR_ENV = "ENGRAM_FORGET_LEDGER_DIR"
_FILE = re.compile(r"^forgets-(\d{4}-\d{2}-\d{2})\.jsonl$")


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One forget, as the ledger keeps it: ids and a time, nothing of the text."""

    record_id: str
    scope: dict[str, str]
    operation_id: str
    at: datetime

    def body(self) -> dict[str, Any]:
        return {
            "at": self.at.astimezone(UTC).isoformat(),
            "id": self.record_id,
            "op": self.operation_id,
            "scope": dict(sorted(self.scope.items())),
        }

    def to_line(self) -> str:
        body = self.body()
        return json.dumps({**body, "crc": _crc(body)}, separators=(",", ":")) + "\n"

    @classmethod
    def from_line(cls, line: str) -> LedgerEntry | None:
        """The entry a line holds; None for a torn or damaged line."""
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                return None
            crc = data.pop("crc", None)
            if crc != _crc(data) or set(data) != {"at", "id", "op", "scope"}:
                return None
            scope = Scope.of(data["scope"]).as_dict()
            at = datetime.fromisoformat(data["at"])
            if at.tzinfo is None:
                return None
            if not isinstance(data["id"], str) or not isinstance(data["op"], str):
                return None
        except (ValueError, TypeError, InvalidRequestError):
            return None
        return cls(record_id=data["id"], scope=scope, operation_id=data["op"], at=at)


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


def default_dir(env: Mapping[str, str] | None = None) -> Path:
    """``ENGRAM_FORGET_LEDGER_DIR``, else ``ENGRAM_HOME/ledger`` (home: ``.engram``)."""
    read = Env(env)
    configured = read.optional(LEDGER_DIR_ENV)
    if configured:
        return Path(configured)
    return Path(read.text("ENGRAM_HOME", ".engram")) / "ledger"


class ForgetLedger:
    """An append-only, content-free record of forgets in ``directory``."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_dir()

    def __repr__(self) -> str:
        return f"ForgetLedger({str(self.directory)!r})"

    # -- writing ------------------------------------------------------------------

    def append(self, entries: Iterable[LedgerEntry]) -> None:
        """Append ``entries``; durable (file and directory fsynced) when it returns."""
        lines = "".join(e.to_line() for e in entries)
        if not lines:
            return
        path = self.directory / f"forgets-{datetime.now(UTC).date().isoformat()}.jsonl"
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            created = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                _cut_torn_tail(fd, path)
                _write_all(fd, lines.encode())
                os.fsync(fd)
            finally:
                os.close(fd)  # releases the lock
            if created:
                fsync_dir(self.directory)
        except OSError as exc:
            raise LedgerUnavailableError(
                f"the forget ledger at {self.directory} cannot be written: {exc.strerror}"
            ) from None

    # -- reading ------------------------------------------------------------------

    def files(self, since: datetime | None = None) -> list[Path]:
        """The ledger's files, oldest first (those of days before ``since`` left out)."""
        if not self.directory.is_dir():
            return []
        if since is not None and since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        first = since.astimezone(UTC).date() if since is not None else date.min
        found = []
        for path in self.directory.iterdir():
            m = _FILE.match(path.name)
            if m and date.fromisoformat(m.group(1)) >= first:
                found.append(path)
        return sorted(found)

    def entries(
        self, since: datetime | None = None, scan: Scan | None = None
    ) -> Iterator[LedgerEntry]:
        """Every good entry, in the order appended (``at`` >= ``since`` only; a naive
        ``since`` is UTC); damaged lines are skipped, and counted in ``scan`` when given."""
        if since is not None and since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        for path in self.files(since):
            if scan is not None:
                scan.files += 1
            with path.open("r", encoding="utf-8", errors="replace", newline="\n") as f:
                for number, line in enumerate(f, 1):
                    entry = LedgerEntry.from_line(line) if line.endswith("\n") else None
                    if entry is None:
                        if line.strip():
                            _damaged(scan, path, number, torn=not line.endswith("\n"))
                        continue
                    if since is not None and entry.at < since:
                        continue
                    if scan is not None:
                        scan.entries += 1
                    yield entry

    def scan(self) -> Scan:
        """Read the whole ledger: how many files, good entries and damaged lines."""
        found = Scan()
        for _ in self.entries(scan=found):
            pass
        return found


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
