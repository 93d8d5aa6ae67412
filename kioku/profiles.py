"""Per-model numbers, all in tokens of the serving model.

The seed's figures were characters for a 64k local window: trigger 48,000 chars (~30k tokens),
ceiling 56,000 (~35k), minimum raw history 16,000 (~10k), chapters of ~1,100 chars, a major GC
when chapters pass 6,000 chars, backlog pieces of 32,000 chars. A 1M-token cloud model keeps
~200,000 chars (~125k tokens) raw instead: what sets the trigger is the cost of re-reading the
prompt after a cache break, not the window.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kioku.errors import ConfigError

DEFAULT_SUMMARY_DELAY_S = 30.0
DEFAULT_SUMMARY_DURATION_S = 30.0  # what one summary took in the seed; used by simulations
DEFAULT_SUMMARY_CEILING_TOKENS = 4096  # never cut a summary mid-sentence
# What one image costs in the prompt, whatever its pixels: OpenAI's high-detail 1024×1024 tile
# count (765) rounded up; Gemma 3 takes 256 per image, LLaVA 576. Set it to the model's number.
DEFAULT_IMAGE_TOKENS = 768


@dataclass(frozen=True)
class Profile:
    name: str
    window: int
    response_reserve: int
    trigger: int  # history (memory + raw) past this schedules a summary job
    ceiling: int  # history past this is cut now, even with no summary ready
    min_raw: int  # the raw window never shrinks below this after a fold
    headroom: int  # after a fold, this much room remains before the next trigger
    chapter_tokens: int  # target length of one chapter
    synopsis_tokens: int  # target length of the synopsis
    major_gc: int  # chapters' total past this folds the older half into the synopsis
    summary_chunk: int  # most raw tokens one summary job reads
    notes_tokens: int = 600
    recollection_tokens: int = 800
    summary_ceiling: int = DEFAULT_SUMMARY_CEILING_TOKENS
    summary_delay_s: float = DEFAULT_SUMMARY_DELAY_S
    summary_duration_s: float = DEFAULT_SUMMARY_DURATION_S
    connect_timeout_s: float = 10.0
    reply_timeout_s: float = 120.0
    summary_timeout_s: float = 300.0
    image_tokens: int = DEFAULT_IMAGE_TOKENS  # per image (or other media part) in a message

    def __post_init__(self) -> None:
        if not 0 < self.min_raw < self.trigger < self.ceiling:
            raise ConfigError(
                f"profile {self.name!r}: need 0 < min_raw < trigger < ceiling, got "
                f"{self.min_raw} / {self.trigger} / {self.ceiling}"
            )
        if self.ceiling + self.response_reserve > self.window:
            raise ConfigError(
                f"profile {self.name!r}: ceiling {self.ceiling} + response reserve "
                f"{self.response_reserve} exceeds the window {self.window}"
            )
        if self.headroom >= self.trigger:
            raise ConfigError(f"profile {self.name!r}: headroom must be below the trigger")

    @property
    def prompt_budget(self) -> int:
        """The most prompt tokens that still leave the response reserve inside the window."""
        return self.window - self.response_reserve

    def raw_target(self, memory_tokens: int) -> int:
        """How much raw history to keep after a fold: headroom before the next trigger,
        shrinking as memory grows, never below the minimum."""
        return max(self.min_raw, self.trigger - self.headroom - memory_tokens)

    def scaled(self, window: int) -> Profile:
        """The same profile for another window, every threshold in proportion."""
        if window <= 0:
            raise ConfigError("window must be positive")
        f = window / self.window

        def s(v: int, floor: int = 1) -> int:
            return max(floor, round(v * f))

        out = replace(
            self,
            name=f"{self.name}@{window}",
            window=window,
            response_reserve=s(self.response_reserve, 256),
            trigger=s(self.trigger),
            ceiling=s(self.ceiling),
            min_raw=s(self.min_raw),
            headroom=s(self.headroom),
            chapter_tokens=min(self.chapter_tokens, s(self.chapter_tokens, 300)),
            synopsis_tokens=s(self.synopsis_tokens, 600),
            major_gc=s(self.major_gc, 1200),
            summary_chunk=s(self.summary_chunk, 1024),
            notes_tokens=s(self.notes_tokens, 128),
            recollection_tokens=s(self.recollection_tokens, 128),
        )
        return out.fitted()

    def fitted(self) -> Profile:
        """This profile with memory's three sizes shrunk together until synopsis + major GC + a
        chapter fit under the trigger beside the minimum raw window. Scaling keeps floors that
        make memory items readable, but at a very small window those floors would not fit, and
        every turn would end in a forced cut."""
        room = self.trigger - self.min_raw
        need = self.synopsis_tokens + self.major_gc + self.chapter_tokens
        if need <= room:
            return self
        k = room / need
        return replace(
            self,
            chapter_tokens=max(64, int(self.chapter_tokens * k)),
            synopsis_tokens=max(64, int(self.synopsis_tokens * k)),
            major_gc=max(128, int(self.major_gc * k)),
        )


LOCAL_64K = Profile(
    name="local-64k",
    window=65536,
    response_reserve=4096,
    trigger=30000,
    ceiling=35000,
    min_raw=10000,
    headroom=14000,
    chapter_tokens=900,
    synopsis_tokens=2400,
    major_gc=4800,
    summary_chunk=20000,
)

CLOUD_1M = Profile(
    name="cloud-1m",
    window=1_000_000,
    response_reserve=16384,
    trigger=125_000,
    ceiling=160_000,
    min_raw=80_000,
    headroom=40_000,
    chapter_tokens=1200,
    synopsis_tokens=4000,
    major_gc=9600,
    summary_chunk=20000,
    notes_tokens=1500,
    recollection_tokens=2000,
)

LOCAL_8K = Profile(
    name="local-8k",
    window=8192,
    response_reserve=1024,
    trigger=4000,
    ceiling=5600,
    min_raw=1200,
    headroom=1800,
    chapter_tokens=300,
    synopsis_tokens=600,
    major_gc=1200,
    summary_chunk=2500,
    notes_tokens=200,
    recollection_tokens=300,
)

PROFILES: dict[str, Profile] = {p.name: p for p in (LOCAL_64K, CLOUD_1M, LOCAL_8K)}


def get_profile(name: str, window: int | None = None) -> Profile:
    try:
        p = PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"unknown profile {name!r}; choose one of {', '.join(PROFILES)}"
        ) from None
    return p.scaled(window) if window else p
