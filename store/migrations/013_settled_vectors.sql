-- engram schema v13: vectors are written fresh and settled in bulk (issue 21). A vector
-- row is written with settled = false: it is in no approximate index, so its insert
-- costs no HNSW graph insertion. A job marks a large scope's fresh rows settled, in
-- batches; the scope's partial HNSW index holds only settled rows, and recall searches
-- the fresh rest exactly through the small index below.
ALTER TABLE engram_vectors ADD COLUMN settled boolean NOT NULL DEFAULT false;
CREATE INDEX engram_vectors_fresh_idx ON engram_vectors (generation_id, scope_id)
    WHERE NOT settled;

-- The approximate indexes built before held every row of their scope, and so cost each
-- write into it a graph insertion. They go: the job builds them again on settled rows.
DO $$
DECLARE
    name text;
BEGIN
    FOR name IN SELECT index_name FROM engram_vector_indexes LOOP
        EXECUTE format('DROP INDEX IF EXISTS %I', name);
    END LOOP;
END $$;
DELETE FROM engram_vector_indexes;
