-- engram schema v4: what the dashboard and the HTTP API read, and who asked.
--
-- Every list is read by keyset pagination (never OFFSET): each index below serves
-- one list in its order, so a page costs the same at its start and 1,000,000 rows
-- in. The number of indexes every write maintains is unchanged: the records' and
-- receipts' indexes are replaced by ones that also carry the tie-breaker, and the
-- new ones are partial, holding only rare rows (refusals, replays, forgets, ...).

-- Who asked for an operation (an operator of the dashboard, an API caller), when
-- the producer said; not part of the request digest. How many times a receipt has
-- answered a repeat of its operation, and when last: counted in the transaction that
-- answers the repeat, so first deliveries pay nothing for it.
ALTER TABLE engram_receipts
    ADD COLUMN requested_by text,
    ADD COLUMN replays integer NOT NULL DEFAULT 0,
    ADD COLUMN last_replayed_at timestamptz;

-- Receipts, newest first (ties by operation id): all of them, and a scope's.
DROP INDEX engram_receipts_time_idx;
CREATE INDEX engram_receipts_time_idx ON engram_receipts (committed_at, operation_id);
DROP INDEX engram_receipts_scope_idx;
CREATE INDEX engram_receipts_scope_idx ON engram_receipts (scope_id, committed_at, operation_id);
-- The rare ones an operator filters on, without reading past the common ones.
CREATE INDEX engram_receipts_refused_idx ON engram_receipts (committed_at, operation_id)
    WHERE error IS NOT NULL;
CREATE INDEX engram_receipts_replayed_idx ON engram_receipts (committed_at, operation_id)
    WHERE replays > 0;
CREATE INDEX engram_receipts_redacted_idx ON engram_receipts (committed_at, operation_id)
    WHERE redacted;
CREATE INDEX engram_receipts_forget_idx ON engram_receipts (committed_at, operation_id)
    WHERE kind = 'forget';
CREATE INDEX engram_receipts_requested_idx ON engram_receipts (requested_by, committed_at, operation_id)
    WHERE requested_by IS NOT NULL;

-- A scope's records, most recently changed first (ties by id); the retracted ones
-- and the ones with a time to live on their own.
DROP INDEX engram_records_scope_idx;
CREATE INDEX engram_records_scope_idx ON engram_records (scope_id, updated_at, id);
CREATE INDEX engram_records_retracted_idx ON engram_records (scope_id, updated_at, id)
    WHERE status = 'retracted';
CREATE INDEX engram_records_ttl_idx ON engram_records (scope_id, updated_at, id)
    WHERE expires_at IS NOT NULL;

-- A scope's tombstones, most recent first.
CREATE INDEX engram_forgotten_scope_idx ON engram_forgotten (scope_id, forgotten_at, record_id);

-- Scopes found by any field, exactly or by its beginning (search as you type).
CREATE INDEX engram_scopes_user_idx ON engram_scopes (user_id text_pattern_ops);
CREATE INDEX engram_scopes_agent_idx ON engram_scopes (agent_id text_pattern_ops);
CREATE INDEX engram_scopes_run_idx ON engram_scopes (run_id text_pattern_ops);
CREATE INDEX engram_scopes_actor_idx ON engram_scopes (actor_id text_pattern_ops);
CREATE INDEX engram_scopes_chat_idx ON engram_scopes (chat_id text_pattern_ops);

-- Actions that are not memory operations (a dead letter retried or discarded, a
-- reembed started), with who asked. Content-free: ids and counts only.
CREATE TABLE engram_audit (
    id            bigserial PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    requested_by  text NOT NULL,
    action        text NOT NULL,
    target        text NOT NULL,
    detail        jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX engram_audit_at_idx ON engram_audit (at, id);
