"""kioku as a service: an OpenAI-compatible memory proxy, a REST API for operators, API keys.

    client (openai SDK, SillyTavern) ──▶ kioku serve ──▶ upstream (llama.cpp, vLLM, a cloud)
                                          │  store first, sync, fold, build the prompt
                                          ▼
                                   SQLite / PostgreSQL ◀── kioku worker (summaries)

- `app.create_app(settings, …)` builds the FastAPI app; `cli.register` adds `kioku serve`,
  `kioku keys …` and `kioku bench serve`.
- `proxy` runs a turn: sync the request with the log (`kioku.sync`), `Conversation.prepare_for`,
  forward to the upstream (`upstream`), `Conversation.record`.
- `api` is the REST API the console uses; `keys` the API keys; `metrics` the Prometheus text.
"""
