"""kioku as a service: an OpenAI-compatible memory proxy, a REST API for operators, API keys.

    client (openai SDK, SillyTavern) ──▶ kioku serve ──▶ upstream (llama.cpp, vLLM, a cloud)
                                          │  store first, sync, fold, build the prompt
                                          ▼
                                   SQLite / PostgreSQL ◀── kioku worker (summaries)

- `app.create_app(settings, …)` builds the FastAPI app; `cli.register` adds `kioku serve`,
  `kioku keys …` and `kioku bench serve`.
- `proxy` runs a turn: sync the request with the log (`kioku.sync`), `Conversation.prepare_for`,
  forward to the upstream (`upstream`), `Conversation.record`.
- `turns` admits one turn at a time per conversation (across processes) and replays a
  duplicate's reply; `limits` refuses what can never be served (413/415/400) before parsing.
- `serving` runs the app in one process or `--workers N`.
- `api` is the REST API the console uses; `keys` the API keys; `metrics` the Prometheus text.
"""
