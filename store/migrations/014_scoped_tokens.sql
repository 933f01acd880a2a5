-- engram schema v14: scoped access tokens (issue 28) and the log of what each read.
-- A token is bound to one exact scope and a set of capabilities; only the sha256 of
-- its secret is kept. A revoked token keeps its row (and its name, which receipts
-- and the audit name): the read log and the operations it made still point at it.
CREATE TABLE IF NOT EXISTS engram_tokens (
    id            bigserial PRIMARY KEY,
    name          text NOT NULL UNIQUE,
    secret_sha256 bytea NOT NULL UNIQUE,
    scope_key     text NOT NULL,
    can           text[] NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    created_by    text NOT NULL,
    expires_at    timestamptz,
    revoked_at    timestamptz,
    revoked_by    text,
    last_used_at  timestamptz
);

-- What a token read: one row per record revision a read returned. Content-free by
-- construction: ids, revisions, the tool and the time; never a text, never a query.
CREATE TABLE IF NOT EXISTS engram_token_reads (
    id         bigserial PRIMARY KEY,
    token_id   bigint NOT NULL REFERENCES engram_tokens (id) ON DELETE CASCADE,
    at         timestamptz NOT NULL DEFAULT now(),  -- one read's rows share it
    tool       text NOT NULL CHECK (tool IN ('recall', 'get', 'history')),
    record_id  text NOT NULL,
    revision   integer NOT NULL
);
CREATE INDEX IF NOT EXISTS engram_token_reads_record_idx ON engram_token_reads (record_id, at);
CREATE INDEX IF NOT EXISTS engram_token_reads_token_idx ON engram_token_reads (token_id, at, id);
CREATE INDEX IF NOT EXISTS engram_token_reads_at_idx ON engram_token_reads (at);

-- The operations a server enqueued for a token it verified: what makes a receipt's
-- ``requested_by`` (``token:NAME``) authenticated rather than claimed. Written by the
-- server before it enqueues; a producer that only reaches Redis cannot write here.
CREATE TABLE IF NOT EXISTS engram_vouched_operations (
    operation_id  text PRIMARY KEY,
    requested_by  text NOT NULL,
    token_id      bigint NOT NULL REFERENCES engram_tokens (id) ON DELETE CASCADE,
    at            timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS engram_vouched_operations_at_idx ON engram_vouched_operations (at);
