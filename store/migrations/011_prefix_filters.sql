-- engram schema v11: the operation log filtered by the beginning of a record id or of
-- who asked (store/receipt_filter.py), read through an index whatever the collation.
--
-- text_pattern_ops sorts byte by byte, which is what "begins with" needs (see 009),
-- and serves equality too: so the receipts' record ids' and who asked's indexes are
-- replaced, not doubled, and every write maintains as many indexes as before. The
-- tombstones' ids are read through 009's index.
DROP INDEX engram_receipt_records_record_idx;
CREATE INDEX engram_receipt_records_record_idx ON engram_receipt_records (record_id text_pattern_ops);
DROP INDEX engram_receipts_requested_idx;
CREATE INDEX engram_receipts_requested_idx ON engram_receipts (requested_by text_pattern_ops, committed_at, operation_id)
    WHERE requested_by IS NOT NULL;
