-- Forgets whose redaction listeners have not finished: the jobs' sweeper looks
-- for ones left pending too long (a worker that died between its commit and
-- handing the forget to the jobs, a job lost with its Redis), so that every
-- forget's redaction ends complete or failed. Few rows ever match.
CREATE INDEX engram_receipts_redaction_pending_idx ON engram_receipts (committed_at)
    WHERE redaction = 'pending';
