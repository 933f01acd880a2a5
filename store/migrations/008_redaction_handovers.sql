-- A forget's redaction handed over again and again (its job lost each time: a listener
-- that kills its jobs worker) must end: the jobs count the hand-overs here, and stop
-- at ENGRAM_REDACTION_MAX_HANDOVERS with redaction 'failed' and a content-free reason.
ALTER TABLE engram_receipts
    ADD COLUMN redaction_handovers integer NOT NULL DEFAULT 0,
    ADD COLUMN redaction_reason text;
