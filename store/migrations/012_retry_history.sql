-- engram schema v12: a dead letter's earlier attempts. A retry removes the letter and
-- writes its audit row (who, why, and what the letter went through); when the same
-- operation is dead-lettered again, its page lists those rows, found by operation id.
CREATE INDEX engram_audit_retried_op_idx ON engram_audit ((detail ->> 'operation_id'), at, id)
    WHERE action = 'dead_letter.retry';
