-- engram schema v16: a refusal found by the record it named. A refused revise, retract
-- or forget touched no record, so engram_receipt_records holds nothing for it; its
-- request still names the record ("id"). The receipts filtered by record (the receipts
-- list, a record's page) take these too, through this index of the refusals alone
-- (few rows: a refusal is rare).
CREATE INDEX engram_receipts_refused_record_idx ON engram_receipts ((request ->> 'id'))
    WHERE error IS NOT NULL;
