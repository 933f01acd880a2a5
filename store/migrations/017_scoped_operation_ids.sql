-- engram schema v17: an operation id identifies an operation within its scope (issue 36).
--
-- The same id in two scopes is two operations, each applied once, and nothing about one
-- is visible from the other: a receipt is keyed by (scope, operation id), and so are the
-- rows that hang from it and the vouches a server writes for a token (keyed by the
-- token's scope). Every receipt stored so far already belongs to one scope, so the rows
-- keep their meaning: each gains its receipt's scope.

-- The records a receipt wrote or named: their receipt's scope, then the composite key.
ALTER TABLE engram_receipt_records ADD COLUMN scope_id bigint;
UPDATE engram_receipt_records rr SET scope_id = c.scope_id
FROM engram_receipts c WHERE c.operation_id = rr.operation_id;
ALTER TABLE engram_receipt_records ALTER COLUMN scope_id SET NOT NULL;

ALTER TABLE engram_receipt_named ADD COLUMN scope_id bigint;
UPDATE engram_receipt_named n SET scope_id = c.scope_id
FROM engram_receipts c WHERE c.operation_id = n.operation_id;
ALTER TABLE engram_receipt_named ALTER COLUMN scope_id SET NOT NULL;

ALTER TABLE engram_receipt_records DROP CONSTRAINT engram_receipt_records_operation_id_fkey;
ALTER TABLE engram_receipt_named DROP CONSTRAINT engram_receipt_named_operation_id_fkey;
ALTER TABLE engram_receipts DROP CONSTRAINT engram_receipts_pkey;
ALTER TABLE engram_receipts ADD PRIMARY KEY (scope_id, operation_id);

ALTER TABLE engram_receipt_records DROP CONSTRAINT engram_receipt_records_pkey;
ALTER TABLE engram_receipt_records ADD PRIMARY KEY (scope_id, operation_id, record_id, revision);
ALTER TABLE engram_receipt_records ADD FOREIGN KEY (scope_id, operation_id)
    REFERENCES engram_receipts (scope_id, operation_id) ON DELETE CASCADE;

ALTER TABLE engram_receipt_named DROP CONSTRAINT engram_receipt_named_pkey;
ALTER TABLE engram_receipt_named ADD PRIMARY KEY (scope_id, operation_id, record_id);
ALTER TABLE engram_receipt_named ADD FOREIGN KEY (scope_id, operation_id)
    REFERENCES engram_receipts (scope_id, operation_id) ON DELETE CASCADE;

-- The operator's look-up of an id in every scope (the operation page, GET
-- /api/v1/operations/ID without a scope): the primary key leads with the scope.
CREATE INDEX engram_receipts_operation_idx ON engram_receipts (operation_id);

-- Vouches: the operations a server enqueued for a token, in the token's scope. A vouch
-- another scope's token wrote for the same id says nothing of this scope's operation.
ALTER TABLE engram_vouched_operations ADD COLUMN scope_key text;
UPDATE engram_vouched_operations vo SET scope_key = t.scope_key
FROM engram_tokens t WHERE t.id = vo.token_id;
ALTER TABLE engram_vouched_operations ALTER COLUMN scope_key SET NOT NULL;
ALTER TABLE engram_vouched_operations DROP CONSTRAINT engram_vouched_operations_pkey;
ALTER TABLE engram_vouched_operations ADD PRIMARY KEY (scope_key, operation_id);
