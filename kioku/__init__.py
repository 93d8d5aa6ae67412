"""kioku: long-term memory for one LLM conversation far longer than the window."""
