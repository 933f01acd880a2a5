-- A pending generation may be cancelled by an operator: a terminal status of its own,
-- like retired it never returns, and its vectors are deleted.
ALTER TABLE engram_generations DROP CONSTRAINT engram_generations_status_check;
ALTER TABLE engram_generations ADD CONSTRAINT engram_generations_status_check
    CHECK (status IN ('pending', 'active', 'retired', 'cancelled'));
