-- The words of a recall query, read the way the records were indexed.
--
-- Records are indexed with the `simple` configuration (every word, lower-cased,
-- none stemmed: names, codes and numbers are found as written). A query read with
-- `simple` as well keeps words such as "the", "what" and "does": in a lexical
-- search with OR semantics they match most of a scope, and ranking every match
-- made recall at 100,000 records take hundreds of milliseconds while adding
-- nothing but noise to the fusion. `engram_query` reads a query with the same
-- parser and the same lower-casing, less PostgreSQL's English stop words. A query
-- made only of stop words falls back to `simple` (store/recall.py).
CREATE TEXT SEARCH DICTIONARY engram_query_words (TEMPLATE = pg_catalog.simple, STOPWORDS = english);
CREATE TEXT SEARCH CONFIGURATION engram_query (COPY = pg_catalog.simple);
ALTER TEXT SEARCH CONFIGURATION engram_query ALTER MAPPING REPLACE simple WITH engram_query_words;

-- A query's words combined into one tsquery, any of them or all of them.
CREATE AGGREGATE engram_tsquery_or (tsquery) (SFUNC = pg_catalog.tsquery_or, STYPE = tsquery);
CREATE AGGREGATE engram_tsquery_and (tsquery) (SFUNC = pg_catalog.tsquery_and, STYPE = tsquery);
