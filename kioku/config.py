"""Settings: typed, frozen, read from the environment in one function, turned into a `Kioku`.

Every command and the server build their engine here, so "which models, which profile, which
database" is decided in one place. Nothing happens at import.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kioku.errors import ConfigError
from kioku.profiles import Profile, get_profile

if TYPE_CHECKING:  # imported when an engine is built, not with the settings
    from kioku.engine import Kioku
    from kioku.hooks import MemoryLayers
    from kioku.store import Store

DEFAULT_DB = "sqlite:///kioku.db"
DEFAULT_PROFILE = "local-64k"
# What `kioku serve` admits (see kioku.service.limits): a body over the size is refused with 413
# before it is read (images in content parts need a few MB), and so is a transcript with more
# messages (a stateless client resends its window; kioku keeps the rest).
DEFAULT_MAX_BODY_BYTES = 8 * 2**20
DEFAULT_MAX_MESSAGES = 20_000


@dataclass(frozen=True)
class Settings:
    db: str = DEFAULT_DB
    profile: str = DEFAULT_PROFILE
    window: int | None = None
    # seconds between asking the upstream its window again (`kioku serve --window auto`: it
    # follows a change); None: never
    window_probe_s: float | None = None
    llm_url: str | None = None  # the reply model (OpenAI-compatible base URL)
    llm_model: str | None = None
    summarizer_url: str | None = None  # the chronicler's model; defaults to llm_url
    summarizer_model: str | None = None
    api_key: str | None = None
    tokenizer: str = "estimate"  # see kioku.counters.counter_from_spec
    tenant: str = "default"
    layers: bool = True
    # Some chat templates silently drop system messages: with False
    # the chronicler's instructions open the user turn instead.
    system_role: bool = True
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_messages: int = DEFAULT_MAX_MESSAGES
    # seconds a summary job waits before it runs (None: the profile's, 30 s): replays, tests
    # and benchmarks set 0 so they need not wait for the GPU-sharing delay
    summary_delay_s: float | None = None
    # seconds to wait for one chronicler reply (None: the profile's; a local model on a CPU
    # takes minutes), and the chronicler's temperature (None: ChroniclerConfig's low default)
    summary_timeout_s: float | None = None
    # seconds to wait for the reply model (None: the profile's, 120 s): the whole answer, or
    # for a streamed one the longest silence between its bytes
    reply_timeout_s: float | None = None
    summary_temperature: float | None = None
    # browser origins allowed to call the REST API (the SillyTavern extension's page)
    cors_origins: tuple[str, ...] = ()
    # the ablation of issue 22: keep the card as the client sent it (the parts it marks as
    # changing stay in it, pushed-out examples leave it), as kioku did before
    card_as_sent: bool = False

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    @property
    def profile_obj(self) -> Profile:
        p = get_profile(self.profile, self.window)
        if self.summary_delay_s is not None:
            p = replace(p, summary_delay_s=self.summary_delay_s)
        if self.summary_timeout_s is not None:
            p = replace(p, summary_timeout_s=self.summary_timeout_s)
        if self.reply_timeout_s is not None:
            p = replace(p, reply_timeout_s=self.reply_timeout_s)
        return p

    @property
    def chronicler_url(self) -> str | None:
        return self.summarizer_url or self.llm_url

    @property
    def chronicler_model_name(self) -> str | None:
        return self.summarizer_model or self.llm_model


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    window = env.get("KIOKU_WINDOW")
    delay = env.get("KIOKU_SUMMARY_DELAY")
    timeout = env.get("KIOKU_SUMMARY_TIMEOUT")
    reply_timeout = env.get("KIOKU_REPLY_TIMEOUT")
    probe = env.get("KIOKU_WINDOW_PROBE_S")
    temperature = env.get("KIOKU_SUMMARY_TEMPERATURE")
    return Settings(
        db=env.get("KIOKU_DB", DEFAULT_DB),
        profile=env.get("KIOKU_PROFILE", DEFAULT_PROFILE),
        window=_window(window) if window else None,
        window_probe_s=_seconds("KIOKU_WINDOW_PROBE_S", probe, positive=True) if probe else None,
        llm_url=env.get("KIOKU_LLM_URL") or None,
        llm_model=env.get("KIOKU_LLM_MODEL") or None,
        summarizer_url=env.get("KIOKU_SUMMARIZER_URL") or None,
        summarizer_model=env.get("KIOKU_SUMMARIZER_MODEL") or None,
        api_key=env.get("KIOKU_LLM_API_KEY") or None,
        tokenizer=env.get("KIOKU_TOKENIZER", "estimate"),
        tenant=env.get("KIOKU_TENANT", "default"),
        system_role=env.get("KIOKU_SYSTEM_ROLE", "1") not in ("0", "false", "no"),
        max_body_bytes=int(env.get("KIOKU_MAX_BODY_BYTES") or DEFAULT_MAX_BODY_BYTES),
        max_messages=int(env.get("KIOKU_MAX_MESSAGES") or DEFAULT_MAX_MESSAGES),
        summary_delay_s=_seconds("KIOKU_SUMMARY_DELAY", delay) if delay else None,
        summary_timeout_s=_seconds("KIOKU_SUMMARY_TIMEOUT", timeout, positive=True)
        if timeout
        else None,
        reply_timeout_s=_seconds("KIOKU_REPLY_TIMEOUT", reply_timeout, positive=True)
        if reply_timeout
        else None,
        summary_temperature=_temperature(temperature) if temperature else None,
        cors_origins=tuple(
            o.strip() for o in env.get("KIOKU_CORS_ORIGINS", "").split(",") if o.strip()
        ),
        card_as_sent=env.get("KIOKU_CARD_AS_SENT", "0") not in ("0", "false", "no", ""),
    )


def _seconds(name: str, value: str, positive: bool = False) -> float:
    try:
        s = float(value)
    except ValueError:
        s = -1.0
    if not (s > 0 if positive else s >= 0):
        more = "more than 0" if positive else "0 or more"
        raise ConfigError(f"{name}={value!r}: give a number of seconds, {more}")
    return s


def window_size(value: str) -> int | None:
    """A window as `--window` and KIOKU_WINDOW give it: tokens, or "auto" (None: `kioku serve`
    asks the upstream). ValueError for anything else."""
    if value.strip().lower() == "auto":
        return None
    n = int(value)
    if n <= 0:
        raise ValueError(value)
    return n


def _window(value: str) -> int | None:
    try:
        return window_size(value)
    except ValueError:
        raise ConfigError(f"KIOKU_WINDOW={value!r}: give a number of tokens, or auto") from None


def _temperature(value: str) -> float:
    try:
        t = float(value)
    except ValueError:
        t = -1.0
    if not 0 <= t <= 2:
        raise ConfigError(f"KIOKU_SUMMARY_TEMPERATURE={value!r}: give a number from 0 to 2")
    return t


def to_env(settings: Settings) -> dict[str, str]:
    """The environment `from_env` reads these settings back from (for processes a server
    starts: `kioku serve --workers N`)."""
    s = settings
    pairs = {
        "KIOKU_DB": s.db,
        "KIOKU_PROFILE": s.profile,
        "KIOKU_WINDOW": s.window,
        "KIOKU_WINDOW_PROBE_S": s.window_probe_s,
        "KIOKU_LLM_URL": s.llm_url,
        "KIOKU_LLM_MODEL": s.llm_model,
        "KIOKU_SUMMARIZER_URL": s.summarizer_url,
        "KIOKU_SUMMARIZER_MODEL": s.summarizer_model,
        "KIOKU_LLM_API_KEY": s.api_key,
        "KIOKU_TOKENIZER": s.tokenizer,
        "KIOKU_TENANT": s.tenant,
        "KIOKU_SYSTEM_ROLE": "1" if s.system_role else "0",
        "KIOKU_MAX_BODY_BYTES": s.max_body_bytes,
        "KIOKU_MAX_MESSAGES": s.max_messages,
        "KIOKU_SUMMARY_DELAY": s.summary_delay_s,
        "KIOKU_SUMMARY_TIMEOUT": s.summary_timeout_s,
        "KIOKU_REPLY_TIMEOUT": s.reply_timeout_s,
        "KIOKU_SUMMARY_TEMPERATURE": s.summary_temperature,
        "KIOKU_CORS_ORIGINS": ",".join(s.cors_origins) or None,
        "KIOKU_CARD_AS_SENT": "1" if s.card_as_sent else None,
    }
    return {k: str(v) for k, v in pairs.items() if v is not None}


def chronicler_model(settings: Settings, url: str | None = None) -> Any:
    """The chronicler's chat model the settings name (`url` first), or None (extractive):
    KIOKU_SUMMARIZER_URL/MODEL, else the reply model's, with KIOKU_LLM_API_KEY and the
    profile's summary timeout. Every command that summarizes builds it here."""
    base = url or settings.chronicler_url
    if not base:
        return None
    from kioku.client import OpenAIChatModel

    return OpenAIChatModel(
        base,
        model=settings.chronicler_model_name,
        api_key=settings.api_key,
        profile=settings.profile_obj,
    )


def writes_chapters(settings: Settings) -> bool:
    """Whether a model writes the chapters: one named as the chronicler always does, the reply
    model where the profile lets it (`Profile.reply_model_chronicles`)."""
    if settings.summarizer_url:
        return True
    return settings.llm_url is not None and settings.profile_obj.reply_model_chronicles


def chronicler_config(settings: Settings, **changes: Any) -> Any:
    """The chronicler's configuration the settings name (system role, temperature)."""
    from kioku.chronicler import ChroniclerConfig

    config = ChroniclerConfig(system_role=settings.system_role)
    if settings.summary_temperature is not None:
        config = replace(config, temperature=settings.summary_temperature)
    return replace(config, **changes)


def build_kioku(
    settings: Settings,
    *,
    store: Store | None = None,
    background: bool = False,
    clock: Callable[[], float] | None = None,
    simulated_duration_s: float = 0.0,
) -> Kioku:
    """A `Kioku` with the models, tokenizer and layers the settings name. `clock` and
    `simulated_duration_s` are for replays on simulated time (benchmarks)."""
    from kioku.counters import counter_from_spec
    from kioku.engine import Kioku
    from kioku.no_layers import NO_LAYERS
    from kioku.store import Store

    profile = settings.profile_obj
    counter = counter_from_spec(settings.tokenizer)
    reply_model = summarizer = notes_model = None
    if settings.llm_url:
        from kioku.client import OpenAIChatModel

        reply_model = OpenAIChatModel(
            settings.llm_url, model=settings.llm_model, api_key=settings.api_key, profile=profile
        )
    notes_model = chronicler_model(settings)
    if notes_model is not None and writes_chapters(settings):
        from kioku.chronicler import LLMChronicler
        from kioku.summarizer import ExtractiveSummarizer

        summarizer = LLMChronicler(
            notes_model, counter, ExtractiveSummarizer(counter), chronicler_config(settings)
        )
    store = store or Store.open(settings.db)
    layers: MemoryLayers = NO_LAYERS
    if settings.layers:
        from kioku.layers import Layers

        layers = Layers(store, notes_model=notes_model)
    return Kioku(
        store,
        profile=profile,
        counter=counter,
        reply_model=reply_model,
        summarizer=summarizer,
        tenant=settings.tenant,
        background=background,
        clock=clock or time.time,
        simulated_duration_s=simulated_duration_s,
        layers=layers,
    )
