"""The model half: the LLM protocol and client, prompts, candidates, model tools."""
