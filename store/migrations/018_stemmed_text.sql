-- Full text in English, names and other languages' words kept as written, and a
-- conversation turn indexed with the turn it answers.
--
-- Records were indexed with the `simple` configuration: every word as written,
-- lower-cased, none stemmed, so "take" did not find "takes" nor "adopting"
-- "adoption". `engram_text` reads ASCII words with PostgreSQL's English Snowball
-- stemmer (its stop words dropped) and every word holding a letter outside ASCII
-- as written (`simple`): a word of another language is not cut by English rules.
-- Numbers, codes, e-mail addresses and URLs stay whole, as the parser reads them.
-- A name is stemmed like any other word ("Caroline" is indexed "carolin"), the
-- same way in a record and in a query, so it is found as it is written.
--
-- Recall reads a query with the same configuration (store/read/recall.py), and so
-- do find and the same-text look-up. A query made only of stop words has no
-- lexical list: its vector list answers it.
CREATE TEXT SEARCH CONFIGURATION engram_text (COPY = pg_catalog.english);
ALTER TEXT SEARCH CONFIGURATION engram_text
    ALTER MAPPING FOR word, hword, hword_part WITH simple;

-- A turn of a conversation is short ("Yes, last Friday!"): what it is about is
-- often in the message before it. A record an extract writes without a model from
-- its second readable message on keeps that message's text as its `context`, and
-- `context_of` names the record holding it. The context is indexed with the text
-- (never shown, never embedded: the vector is the turn's own). A forget of the
-- record named by `context_of` clears both on every revision that holds them
-- (store/write/apply.py), in its transaction, so no words of a forgotten text stay
-- in another record's index entry.
ALTER TABLE engram_revisions ADD COLUMN context text, ADD COLUMN context_of text;
CREATE INDEX engram_revisions_context_of_idx ON engram_revisions (context_of)
    WHERE context_of IS NOT NULL;

ALTER TABLE engram_revisions DROP COLUMN tsv;
ALTER TABLE engram_revisions ADD COLUMN tsv tsvector GENERATED ALWAYS AS (
    to_tsvector('engram_text', text) || to_tsvector('engram_text', coalesce(context, ''))
) STORED;
CREATE INDEX engram_revisions_tsv_idx ON engram_revisions USING gin (tsv)
    WITH (gin_pending_list_limit = 512);
