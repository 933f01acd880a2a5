"""Documented limits and defaults of the store, in one place."""

MAX_TEXT_CHARS = 32_000
MAX_ID_CHARS = 200
MAX_SCOPE_VALUE_CHARS = 200
MAX_KIND_CHARS = 64
# A record's metadata, as canonical JSON: what the doors (the HTTP API, MCP, and a
# Session's or Producer's writes by default) take, since metadata is a record's
# labels, not its content.
MAX_METADATA_BYTES = 16_000
# What a record's metadata may hold when its writer asks for it
# (``Operation.build(..., metadata_bytes=...)``): the LangGraph store, which keeps an
# item's whole value there (a document: LangGraph's PostgresStore takes any size),
# and the writers that carry records already stored (the worker reading the streams,
# import, the forget listeners). 1 MB: a long document (some 150 pages of text). It
# is bounded by a stream entry (worker.defaults.MAX_ENTRY_BYTES, 8 MiB, holds it with
# the text even if every byte were escaped again) and by an answer: a LangGraph
# search or a recall returns at most MAX_TOP_K records, so at most 100 MB of
# metadata (10 MB at LangGraph's default limit of 10) (docs/langgraph.md).
MAX_STORED_METADATA_BYTES = 1_000_000
# How deeply metadata and message content may nest (objects and lists).
MAX_JSON_DEPTH = 32
MAX_SOURCES = 64
MAX_LINKS = 64
MAX_MESSAGES = 256
MAX_TOP_K = 100

DEFAULT_KIND = "semantic"
# What an extract stores as it is (infer: false) is: the record of an event.
RAW_EXTRACT_KIND = "episodic"
DEFAULT_TOP_K = 5
# A hit's score: the cosine similarity of its vector to the query's (0 when negative,
# or with no vector), plus LEXICAL_WEIGHT times the square of the share of the query's
# telling weight its text holds (0 to 1; store.read.recall). A record holding every
# telling word of the query scores at least LEXICAL_WEIGHT; one holding half of it
# gains a quarter of that; one holding none is ranked by its meaning alone. A hit's
# relevance is its score, at most 1 (values.Hit.relevance).
# Tried on LoCoMo (WordLlama, evidence recall@10) and on bench_store's labelled set
# (hit@5 / MRR at 1,000 and 10,000 records) against the reciprocal rank fusion it
# replaced (0.705; 0.95 / 0.854; 0.75 / 0.666): 2 times the square 0.713; 0.93 / 0.889;
# 0.78 / 0.762. The share itself (not squared) at 1.5 scored 0.719 on LoCoMo but 0.77 /
# 0.742 at 10,000: a record holding one word of three of a question worded otherwise
# than its answer outranked the answer's meaning (docs/recall-quality.md).
LEXICAL_WEIGHT = 2.0
# A conversation's turn is often the answer to, or the question of, the turn next to
# it: a hit's score gains this share of the best score of the turns before and after
# it (the message an extract kept as its context, and the record keeping it as
# theirs). On LoCoMo evidence recall@10 0.713 with none, 0.725 at 0.1, 0.734 at 0.3,
# 0.734 at 0.5 (offline replay of the store's scores; docs/recall-quality.md).
NEIGHBOUR_WEIGHT = 0.3
# The neighbours are looked up only for this many candidates, the best by the rest of
# their score, whatever top_k (so that a smaller top_k is the first hits of a larger
# one): a candidate ranked lower would need almost all
# of NEIGHBOUR_WEIGHT's bonus to pass thirty others, and looking up the neighbours of
# all (up to twice CANDIDATES_PER_LIST) made recall 10 to 30 % slower. On LoCoMo
# evidence recall@10 moved by less than 0.003 (docs/recall-quality.md).
NEIGHBOUR_CANDIDATES = 30
# What recall leaves out unless told otherwise: hits of a lower relevance. With the
# default embedder, a fact sharing no word with a question about it has a cosine
# similarity of 0.2 to 0.75 to it, an unrelated one under 0.1; on LoCoMo, whose turns
# share their speakers' names and dates, the cut cost no evidence recall@10
# (docs/recall-quality.md).
DEFAULT_MIN_RELEVANCE = 0.15
# How many candidates each of the vector and lexical lists brings to fusion.
CANDIDATES_PER_LIST = 50

REEMBED_BATCH_SIZE = 64
REEMBED_MAX_PASSES = 3

# A scope whose vectors in one generation pass this count gets its own
# approximate (HNSW) index; smaller scopes are searched exactly. Writes no longer
# pay for the index (they stay fresh until a job settles them), so the bound is
# where the exact search stops being cheap: 10,000 records took 8-10 ms exactly,
# 2-4 ms through the index, with the same hybrid quality (docs/benchmarks.md).
LARGE_SCOPE_VECTORS = 5_000

MAX_WRITE_ATTEMPTS = 5

# Models (reconciliation, extraction with inference).
# The longest answer a model may give; a longer one is refused (model_output).
MAX_MODEL_ANSWER_CHARS = 200_000
# The most facts an extraction, or events a reconciliation, may answer with.
MAX_MODEL_FACTS = 64
MAX_MODEL_EVENTS = 256
MAX_INSTRUCTIONS_CHARS = 4_000

# The OpenAI-compatible client's defaults (ENGRAM_LLM_*).
LLM_TIMEOUT_S = 30.0  # per attempt
LLM_MAX_RETRIES = 3
LLM_BACKOFF_S = 0.5  # the first retry's back-off; it doubles up to LLM_MAX_BACKOFF_S
LLM_MAX_BACKOFF_S = 8.0
# The longest a Retry-After is honoured; an endpoint asking for more fails the call.
LLM_MAX_RETRY_AFTER_S = 60.0
