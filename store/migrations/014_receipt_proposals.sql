-- engram schema v14: what a model proposed and the store did not apply, for the host to
-- decide (issue 27). A reconciliation's DELETE of an asserted record is never a
-- retraction: the receipt names the record instead, as
-- [{"action": "retract", "id": ..., "revision": ...}] (no content). NULL: nothing
-- proposed, as for every receipt committed before.
ALTER TABLE engram_receipts ADD COLUMN proposed jsonb;
