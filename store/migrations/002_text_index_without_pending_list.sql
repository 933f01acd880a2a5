-- The full-text index takes each revision's words at insert time.
--
-- With GIN's default fastupdate, inserts append to a pending list, and the
-- insert that finds the list past gin_pending_list_limit (4 MB) moves all of
-- it into the index inside its own transaction: under a steady write load
-- that stalled one commit in every few thousand for 300-400 ms (measured with
-- bench/bench_worker.py), while the others waited behind it. Without the list
-- each insert costs a little more, always the same, and searches never scan
-- an unsorted list either.
ALTER INDEX engram_revisions_tsv_idx SET (fastupdate = off);
SELECT gin_clean_pending_list('engram_revisions_tsv_idx'::regclass);
