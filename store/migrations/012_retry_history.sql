-- engram schema v12: the audit trail read by what it is about. A retry removes its dead
-- letter and writes its audit row (who, why, and what the letter went through): when
-- the same operation is dead-lettered again, its page lists those rows, found by
-- operation id. A record's page lists the rows about it (a forget's who and why).
CREATE INDEX engram_audit_retried_op_idx ON engram_audit ((detail ->> 'operation_id'), at, id)
    WHERE action = 'dead_letter.retry';
CREATE INDEX engram_audit_target_idx ON engram_audit (target, at, id);
