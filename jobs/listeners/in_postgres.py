"""The PostgreSQL listener: the row versions a forget deleted leave the tables' pages.

A forget deletes its record's rows and rewrites the receipts that held its
text, in one transaction; the old row versions stay in the tables' pages (and
their index entries in the indexes) until VACUUM removes them. This listener
runs one VACUUM of the tables forgets touch for a whole batch of forgets
(``store.write.forgets.vacuum``), once no transaction older than the batch is open,
after deleting any vector still stored for a forgotten record of the batch (one
a re-embedding racing the forget could have stored, were its scopes not locked);
then it rebuilds the full-text index, which keeps every word it ever indexed as
a key (``store.write.forgets.reindex_text``; ``ENGRAM_REDACTION_REINDEX=off`` skips it).
What neither erases (the freed space of a page until it is reused, the
write-ahead log until its segments are overwritten) is measured in
``docs/jobs.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from engram.store import ForgetEvent
from engram.store.write import forgets

from ..context import JobContext

log = logging.getLogger(__name__)


class PostgresListener:
    name = "postgres"

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx

    def __call__(self, events: Sequence[ForgetEvent]) -> None:
        if not events:
            return
        started = time.monotonic()
        forgets.vacuum(
            self.ctx.store.pool,
            wait_s=self.ctx.settings.redaction.wait_s,
            record_ids=sorted({e.record_id for e in events}),
        )
        vacuumed = time.monotonic()
        if self.ctx.settings.redaction.reindex_text:
            forgets.reindex_text(self.ctx.store.pool)
        log.info(
            "forgotten row versions vacuumed",
            extra={
                "records": len({e.record_id for e in events}),
                "vacuum_s": round(vacuumed - started, 3),
                "reindex_s": round(time.monotonic() - vacuumed, 3),
            },
        )
