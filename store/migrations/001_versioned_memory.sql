-- engram schema v1: the versioned memory model.
-- Applied in one transaction by store.migrations; every table is engram's own.

CREATE TABLE engram_scopes (
    id          bigserial PRIMARY KEY,
    key         text NOT NULL UNIQUE,          -- canonical scope key (sorted JSON)
    user_id     text,
    agent_id    text,
    run_id      text,
    actor_id    text,
    chat_id     text,
    revision    bigint NOT NULL DEFAULT 0,     -- +1 per committed operation
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per live record id, unique across the whole store.
CREATE TABLE engram_records (
    id          text PRIMARY KEY,
    scope_id    bigint NOT NULL REFERENCES engram_scopes(id),
    revision    integer NOT NULL CHECK (revision >= 1),
    status      text NOT NULL CHECK (status IN ('active', 'retracted')),
    kind        text NOT NULL,
    expires_at  timestamptz,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);
CREATE INDEX engram_records_scope_idx ON engram_records (scope_id, updated_at DESC);

-- Immutable revisions: the only place memory text lives (besides receipts' requests).
CREATE TABLE engram_revisions (
    record_id     text NOT NULL,
    revision      integer NOT NULL,
    scope_id      bigint NOT NULL REFERENCES engram_scopes(id),
    text          text NOT NULL,
    kind          text NOT NULL,
    importance    real,
    metadata      jsonb NOT NULL DEFAULT '{}',
    origin        text NOT NULL CHECK (origin IN ('asserted', 'inferred')),
    sources       jsonb NOT NULL,
    links         jsonb NOT NULL DEFAULT '[]',
    status        text NOT NULL CHECK (status IN ('active', 'retracted')),
    digest        text NOT NULL,
    operation_id  text NOT NULL,
    recorded_at   timestamptz NOT NULL,
    expires_at    timestamptz,
    -- true on the record's current revision only: lexical recall reads one
    -- table, no join. Everything else in a revision is immutable.
    current       boolean NOT NULL DEFAULT true,
    tsv           tsvector GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED,
    PRIMARY KEY (record_id, revision)
);
CREATE INDEX engram_revisions_scope_time_idx ON engram_revisions (scope_id, recorded_at);
CREATE INDEX engram_revisions_current_idx ON engram_revisions (scope_id) WHERE current;
CREATE INDEX engram_revisions_tsv_idx ON engram_revisions USING gin (tsv);

-- The current revisions' links, so superseded_by is one indexed query.
CREATE TABLE engram_links (
    scope_id   bigint NOT NULL,
    record_id  text NOT NULL,
    relation   text NOT NULL,
    target_id  text NOT NULL,
    PRIMARY KEY (record_id, relation, target_id)
);
CREATE INDEX engram_links_target_idx ON engram_links (scope_id, target_id);

CREATE TABLE engram_receipts (
    operation_id    text PRIMARY KEY,
    scope_id        bigint NOT NULL REFERENCES engram_scopes(id),
    kind            text NOT NULL,
    request_digest  text NOT NULL,
    scope_revision  bigint NOT NULL,
    committed_at    timestamptz NOT NULL,
    request         jsonb,                 -- NULL once redacted
    redacted        boolean NOT NULL DEFAULT false,
    forgotten_revisions integer[],         -- forget only
    already_forgotten   boolean,           -- forget only
    redaction       text CHECK (redaction IN ('pending', 'complete', 'failed', 'none')),
    stream_entry    text,
    -- A refusal (revision conflict, not found, ...): its error, content-free. It
    -- committed nothing and raised no scope revision; a redelivery answers the same.
    error           jsonb
);
CREATE INDEX engram_receipts_scope_idx ON engram_receipts (scope_id, scope_revision DESC);
CREATE INDEX engram_receipts_time_idx ON engram_receipts (committed_at);

CREATE TABLE engram_receipt_records (
    operation_id  text NOT NULL REFERENCES engram_receipts(operation_id) ON DELETE CASCADE,
    record_id     text NOT NULL,
    revision      integer NOT NULL,
    status        text NOT NULL,
    PRIMARY KEY (operation_id, record_id, revision)
);
CREATE INDEX engram_receipt_records_record_idx ON engram_receipt_records (record_id);

-- Content-free tombstones: a forgotten id can never be created again.
CREATE TABLE engram_forgotten (
    record_id     text PRIMARY KEY,
    scope_id      bigint NOT NULL REFERENCES engram_scopes(id),
    forgotten_at  timestamptz NOT NULL,
    operation_id  text NOT NULL
);

CREATE TABLE engram_generations (
    id            serial PRIMARY KEY,
    model_id      text NOT NULL,
    dims          integer NOT NULL CHECK (dims BETWEEN 1 AND 16000),
    status        text NOT NULL CHECK (status IN ('pending', 'active', 'retired')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    activated_at  timestamptz,
    retired_at    timestamptz,
    progress      jsonb NOT NULL DEFAULT '{}'
);
CREATE UNIQUE INDEX engram_generations_one_active ON engram_generations ((true)) WHERE status = 'active';
CREATE UNIQUE INDEX engram_generations_one_pending ON engram_generations ((true)) WHERE status = 'pending';

-- One vector per (generation, record), bound to the revision and text digest
-- it was computed for. Sizes may differ between generations. status, kind and
-- expires_at copy the record's, so the vector search filters without a join.
CREATE TABLE engram_vectors (
    generation_id  integer NOT NULL REFERENCES engram_generations(id),
    record_id      text NOT NULL,
    scope_id       bigint NOT NULL,
    revision       integer NOT NULL,
    digest         text NOT NULL,
    status         text NOT NULL,
    kind           text NOT NULL,
    expires_at     timestamptz,
    embedding      vector NOT NULL,
    PRIMARY KEY (generation_id, record_id)
);
-- Exact in-scope search reads one scope's vectors through this index.
CREATE INDEX engram_vectors_scope_idx ON engram_vectors (generation_id, scope_id);
CREATE INDEX engram_vectors_record_idx ON engram_vectors (record_id);

-- Approximate (HNSW) indexes built for scopes too large for an exact search.
CREATE TABLE engram_vector_indexes (
    generation_id  integer NOT NULL REFERENCES engram_generations(id),
    scope_id       bigint NOT NULL,
    index_name     text NOT NULL UNIQUE,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (generation_id, scope_id)
);

-- Fencing tokens: a writer that lost its partition lease carries an older
-- token and its commit is refused inside the same transaction.
CREATE TABLE engram_fences (
    name   text PRIMARY KEY,
    token  bigint NOT NULL
);
