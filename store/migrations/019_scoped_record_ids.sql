-- engram schema v19: a record id identifies a record within its scope (issue 36).
--
-- Record ids were unique across the store: an id chosen by one scope's client was
-- "taken" for every other scope, so a client could learn that another scope held (or
-- had forgotten) an id, and could create an id another scope would use later (a
-- LangGraph key's id is computable by anyone) so that scope's write was refused. Now
-- the same id in two scopes is two records, and nothing about one is seen, changed or
-- blocked from the other; a forgotten id is refused again in its own scope only.
--
-- Every row that names a record already carries its scope, and an id was unique
-- across the store until now, so the existing rows keep their meaning: only the keys
-- change, each leading with the scope.

ALTER TABLE engram_records DROP CONSTRAINT engram_records_pkey;
ALTER TABLE engram_records ADD PRIMARY KEY (scope_id, id);
-- The operator's look-up of a bare id in every scope (a record's page, /api/v1/records/ID).
CREATE INDEX engram_records_id_idx ON engram_records (id);

ALTER TABLE engram_revisions DROP CONSTRAINT engram_revisions_pkey;
ALTER TABLE engram_revisions ADD PRIMARY KEY (scope_id, record_id, revision);
-- A forget clears the context its record lent to the scope's other records (018).
DROP INDEX engram_revisions_context_of_idx;
CREATE INDEX engram_revisions_context_of_idx ON engram_revisions (scope_id, context_of)
    WHERE context_of IS NOT NULL;

ALTER TABLE engram_links DROP CONSTRAINT engram_links_pkey;
ALTER TABLE engram_links ADD PRIMARY KEY (scope_id, record_id, relation, target_id);

ALTER TABLE engram_vectors DROP CONSTRAINT engram_vectors_pkey;
ALTER TABLE engram_vectors ADD PRIMARY KEY (generation_id, scope_id, record_id);
DROP INDEX engram_vectors_record_idx;
CREATE INDEX engram_vectors_record_idx ON engram_vectors (scope_id, record_id);

-- A tombstone refuses its id again in its own scope only.
ALTER TABLE engram_forgotten DROP CONSTRAINT engram_forgotten_pkey;
ALTER TABLE engram_forgotten ADD PRIMARY KEY (scope_id, record_id);
CREATE INDEX engram_forgotten_id_idx ON engram_forgotten (record_id);

-- What a token read: the token's scope is the record's, so (token, record id) names
-- one record; the record's page finds its reads by its scope's tokens.

-- A refusal found by the record it named (016), in the record's scope.
DROP INDEX engram_receipts_refused_record_idx;
CREATE INDEX engram_receipts_refused_record_idx ON engram_receipts (scope_id, (request ->> 'id'))
    WHERE error IS NOT NULL;
