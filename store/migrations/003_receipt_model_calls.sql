-- How many model calls an operation made (reconciliation, extraction with
-- inference): a receipt says what the operation cost. 0 for every operation
-- committed before, which made none.
ALTER TABLE engram_receipts ADD COLUMN model_calls integer NOT NULL DEFAULT 0;
