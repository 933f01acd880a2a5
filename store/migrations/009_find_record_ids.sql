-- Records found by their id or its beginning, in every scope (the dashboard's Find,
-- GET /api/v1/find). The primary keys sort by the database's collation, which need
-- not be byte order (en_US.utf8 ignores punctuation at first), so a prefix is not a
-- range of them. These indexes sort ids byte by byte: a prefix is one range scan,
-- read in order, stopped at the page's end. Forgotten ids are found as well: a
-- tombstone keeps its record's id.
CREATE INDEX engram_records_id_c_idx ON engram_records ((id COLLATE "C"));
CREATE INDEX engram_forgotten_id_c_idx ON engram_forgotten ((record_id COLLATE "C"));
