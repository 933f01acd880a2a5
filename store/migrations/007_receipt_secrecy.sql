-- engram schema v7: receipts that keep nothing a forget must erase.
--
-- 1. The store's secrets, one row each, never exported. `request_digest` keys the
--    digests receipts keep of their requests (HMAC-SHA256, store/operations.py
--    `keyed_digest`): a copy of engram_receipts alone cannot confirm a guess of a
--    request. 32 bytes from two gen_random_uuid() (PostgreSQL 13+, no extension:
--    pg_strong_random, the source pgcrypto's gen_random_bytes uses too; 244 random
--    bits), made here so that the digests stored before are re-keyed in the same
--    transaction and no plain digest outlives this migration.
CREATE TABLE engram_secrets (
    name        text PRIMARY KEY,
    secret      bytea NOT NULL CHECK (length(secret) >= 32),
    created_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO engram_secrets (name, secret)
VALUES ('request_digest', uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()));

-- HMAC-SHA256 (RFC 2104) in SQL, for this migration only: pgcrypto's hmac() is an
-- extension engram does not require. The key is shorter than SHA-256's 64-byte block.
CREATE FUNCTION pg_temp.engram_hmac(key bytea, message bytea) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT sha256(o.pad || sha256(i.pad || message))
    FROM (SELECT string_agg(set_byte('\x00'::bytea, 0,
                 (CASE WHEN n < length(key) THEN get_byte(key, n) ELSE 0 END) # 54),
                 ''::bytea ORDER BY n) AS pad FROM generate_series(0, 63) AS n) AS i,
         (SELECT string_agg(set_byte('\x00'::bytea, 0,
                 (CASE WHEN n < length(key) THEN get_byte(key, n) ELSE 0 END) # 92),
                 ''::bytea ORDER BY n) AS pad FROM generate_series(0, 63) AS n) AS o
$$;

-- The digests stored so far, keyed: the new digest is HMAC(secret, old digest), so a
-- repeat of an operation committed before this migration still replays. A redacted
-- receipt keeps none: a repeat of its id is answered alike whatever the request.
UPDATE engram_receipts
SET request_digest = CASE WHEN redacted THEN '' ELSE encode(pg_temp.engram_hmac(
        (SELECT secret FROM engram_secrets WHERE name = 'request_digest'),
        convert_to(request_digest, 'UTF8')), 'hex') END;

DROP FUNCTION pg_temp.engram_hmac(bytea, bytea);

-- 2. The records an operation's model decision kept in place of its text (the one an
--    ADD duplicated, the records shown with a NOOP): it wrote nothing to them, so they
--    are not in engram_receipt_records (what a receipt wrote), but the receipt still
--    holds the request, and a forget of one of them redacts it.
CREATE TABLE engram_receipt_named (
    operation_id  text NOT NULL REFERENCES engram_receipts(operation_id) ON DELETE CASCADE,
    record_id     text NOT NULL,
    PRIMARY KEY (operation_id, record_id)
);
CREATE INDEX engram_receipt_named_record_idx ON engram_receipt_named (record_id);
