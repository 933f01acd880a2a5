"""Documented limits and defaults of the store, in one place."""

MAX_TEXT_CHARS = 32_000
MAX_ID_CHARS = 200
MAX_SCOPE_VALUE_CHARS = 200
MAX_KIND_CHARS = 64
MAX_METADATA_BYTES = 16_000
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
RRF_K = 60
# What a place in the lexical list weighs in the fusion, a place in the vector list
# weighing 1: a hit's score is the sum of weight / (RRF_K + rank) over the lists that
# found it, and a lexical place weighs LEXICAL_WEIGHT times the share of the query's
# telling weight the record holds (from LEXICAL_COVER to 1). A record holding every
# telling word outranks the vector list's first alone; one holding a third of them,
# only in the lexical list's first 20 places. On LoCoMo (WordLlama, the default),
# evidence recall@10 was 0.663 at 1, 0.677 at 2, 0.702 at 4 and 0.689 with the
# lexical list alone first, and 0.705 at 4 times the share (MRR 0.515 -> 0.535);
# on the labelled set at 10,000 records, hit@5 0.78 at 1, 0.73 at 4 and 0.75 at 4
# times the share (docs/recall-quality.md).
LEXICAL_WEIGHT = 4.0
# The best score a hit can have, first in both lists.
BEST_SCORE = (1 + LEXICAL_WEIGHT) / (RRF_K + 1)
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
