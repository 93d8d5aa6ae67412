"""Per-model numbers, all in tokens of the serving model's rendered prompt.

Every threshold is measured on the prompt the server reads (`kioku.budget`): system prompt,
memory exchange, raw window with each message's template tokens, and what a turn adds. The
seed's figures were characters for a 64k local window (trigger 48,000 chars ≈ 30k tokens,
ceiling 56,000 ≈ 35k, minimum raw 16,000 ≈ 10k, chapters of ~1,100 chars, a major GC past 6,000
chars, backlog pieces of 32,000 chars); they carried a wide safety margin for a count the seed
could not make. kioku counts exactly, so its trigger sits close to the window: the prompt fills
it, and folds come half as often. A 1M-token cloud model keeps ~200,000 chars (~125k tokens)
raw instead: what sets its trigger is the cost of re-reading after a cache break, not the window.

After a fold the prompt is `headroom` below the trigger (never with less than `min_raw` raw),
so the median prompt uses ~(trigger − headroom / 2) of the budget and a fold comes once per
`headroom` tokens of conversation: the one trade-off between window use and cache breaks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kioku.errors import ConfigError

DEFAULT_SUMMARY_DELAY_S = 30.0
DEFAULT_SUMMARY_DURATION_S = 30.0  # what one summary took in the seed; used by simulations
DEFAULT_SUMMARY_CEILING_TOKENS = 4096  # never cut a summary mid-sentence
# what the memory exchange costs around its items (intro, caveat, headings, the ack), and the
# least a memory item can say and still be read
MEMORY_FRAME_TOKENS = 160
MIN_ITEM_TOKENS = 64
# What one image costs in the prompt, whatever its pixels: OpenAI's high-detail 1024×1024 tile
# count (765) rounded up; open vision models take fewer or about as many (256 to 576). Set it
# to the model's number.
DEFAULT_IMAGE_TOKENS = 768
# What a chronicler prompt costs around its transcript (the instructions and the open threads;
# the chapter prompt is ~600 tokens in English, ~750 in Japanese), and what the transcript adds
# to each message ("#12 · 13:56 · Mika (user)", the part labels): where a chunk is planned
# from message tokens alone, it is planned with these (`Profile.chunk_budget`).
CHRONICLE_PROMPT_TOKENS = 1000
TRANSCRIPT_MESSAGE_TOKENS = 14


@dataclass(frozen=True)
class Profile:
    name: str
    window: int
    response_reserve: int
    trigger: int  # a prompt past this schedules a summary job
    ceiling: int  # a prompt past this is cut now, even with no summary ready (≤ the budget)
    min_raw: int  # the raw window never shrinks below this after a fold
    headroom: int  # after a fold, this much room remains before the next trigger
    chapter_tokens: int  # target length of one chapter
    synopsis_tokens: int  # target length of the synopsis
    major_gc: int  # chapters' total past this folds the older half into the synopsis
    summary_chunk: int  # most raw tokens one summary job reads
    notes_tokens: int = 600
    # Recall by need (`kioku.recall.need`): a turn is shown the past when retrieval's evidence
    # stands out, in the amount that evidence supports, never as a share of the room reserved for
    # it. The best hit stands `recall_standout` × above the background (the median score of the
    # search's best hits) and holds `recall_relevance` of the message's meaning (BM25 score ÷
    # the query's best possible score), or `recall_cued_relevance` when the message points at
    # the past ("remember", 先週, a name the window does not hold); none is shown when the raw
    # window's own best match holds `recall_in_view` of what the archive's best holds (for a
    # question, the best among its newest `recall_present` messages). A statement that does
    # not point at the past is shown nothing; a question that does in words, every match.
    # They trade what memory finds against the prompt prefix a server can reuse: a higher
    # `recall_in_view` shows more and breaks the cache more. 0.7, and these rules for who is
    # held back, kept the strict eval's generational − retrieval margin while reusing the most
    # of the prefix; the figures are in docs/configuration.md ("Why the defaults").
    recall_relevance: float = 0.2
    recall_cued_relevance: float = 0.1
    recall_standout: float = 1.2
    recall_in_view: float = 0.7
    recall_present: int = 12
    # The most one turn's recollections take, as a share of the ceiling. Never held free: a
    # turn whose best recollection finds no room folds the chapter that is ready (one cache
    # break, counted as `recall_breaks`); the rest take what room there is. It binds the
    # questions that ask for the past or about someone by name (the rest take a few windows):
    # 0.25 → 0.35 widened the held-out generational − retrieval margin at 4,096 and 8,192 and
    # left prefix reuse through `kioku serve` as it was (docs/configuration.md).
    recall_room: float = 0.35
    # A message that does not ask keeps its recollections in front of it until the next fold:
    # at most `recall_share` of the room left, `recall_limit` of them, and never more than
    # `extras_share` of the budget for what the raw window carries of what turns were shown.
    # (A question's are shown once, in front of it: `kioku.context`.)
    recall_share: float = 0.5
    recall_limit: int = 6
    extras_share: float = 0.15
    # The most memory (synopsis, major GC, a chapter, notes) may take of the ceiling, where a
    # profile is derived (`scaled`). The floors that keep memory items readable add up to 58% of
    # a 4,096 ceiling, and then the raw window and a question's recollections share what is
    # left. At 4,096 0.40 gave the best strict generational − retrieval margin, on the dev and
    # the held-out half alike, among no cap and 0.30 to 0.50 (docs/configuration.md). At 8,192
    # and above it does not bind.
    memory_share: float = 0.4
    summary_ceiling: int = DEFAULT_SUMMARY_CEILING_TOKENS
    summary_delay_s: float = DEFAULT_SUMMARY_DELAY_S
    summary_duration_s: float = DEFAULT_SUMMARY_DURATION_S
    connect_timeout_s: float = 10.0
    reply_timeout_s: float = 120.0
    summary_timeout_s: float = 300.0
    image_tokens: int = DEFAULT_IMAGE_TOKENS  # per image (or other media part) in a message
    # most tokens of the rendered chronicler prompt one summary job sends: the instructions and
    # the transcript as the model reads it (each message's header and part labels: 1.6× the
    # messages' text in English, 2.4× in Japanese). None: only `summary_chunk` bounds a job.
    summary_prompt: int | None = None
    # Whether the reply model writes the chapters too when no chronicler is named
    # (KIOKU_SUMMARIZER_URL, --summarizer-upstream). A small local model's chapters, grounded
    # line by line, still answered a reader's questions worse than the extractive chronicler's
    # (docs/results.md): a profile for such a model keeps the extractive one unless asked.
    reply_model_chronicles: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.min_raw < self.trigger <= self.ceiling:
            raise ConfigError(
                f"profile {self.name!r}: need 0 < min_raw < trigger <= ceiling, got "
                f"{self.min_raw} / {self.trigger} / {self.ceiling}"
            )
        if self.ceiling + self.response_reserve > self.window:
            raise ConfigError(
                f"profile {self.name!r}: ceiling {self.ceiling} + response reserve "
                f"{self.response_reserve} exceeds the window {self.window}"
            )
        if self.headroom >= self.trigger:
            raise ConfigError(f"profile {self.name!r}: headroom must be below the trigger")
        shares = {
            "recall_share": self.recall_share,
            "extras_share": self.extras_share,
            "recall_room": self.recall_room,
            "recall_relevance": self.recall_relevance,
            "recall_cued_relevance": self.recall_cued_relevance,
            "memory_share": self.memory_share,
        }
        bad = [k for k, v in shares.items() if not 0 <= v <= 1]
        if bad:
            raise ConfigError(f"profile {self.name!r}: {', '.join(bad)} must be 0 to 1")
        if self.recall_standout < 1 or self.recall_in_view < 0 or self.recall_present < 0:
            raise ConfigError(
                f"profile {self.name!r}: recall_standout is 1 or more, recall_in_view and "
                "recall_present 0 or more"
            )

    @property
    def recall_tokens(self) -> int:
        """The most one turn's recollections may take (`recall_room` of the ceiling)."""
        return int(self.ceiling * self.recall_room)

    @property
    def chunk_budget(self) -> int | None:
        """Message tokens one chapter job may read (each message costing its tokens plus
        `TRANSCRIPT_MESSAGE_TOKENS`) so that its rendered prompt stays within `summary_prompt`;
        None when the profile sets no prompt bound."""
        if self.summary_prompt is None:
            return None
        return self.summary_prompt - min(CHRONICLE_PROMPT_TOKENS, self.summary_prompt // 4)

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
        if window == self.window:
            return self  # a named profile's numbers are set and measured as written
        f = window / self.window

        def s(v: int, floor: int = 1) -> int:
            return max(floor, round(v * f))

        reserve = s(self.response_reserve, 256)
        out = replace(
            self,
            name=f"{self.name.split('@')[0]}@{window}",
            window=window,
            response_reserve=reserve,
            trigger=min(s(self.trigger), window - reserve),
            ceiling=min(s(self.ceiling), window - reserve),
            min_raw=s(self.min_raw),
            headroom=s(self.headroom),
            chapter_tokens=min(self.chapter_tokens, s(self.chapter_tokens, 300)),
            synopsis_tokens=s(self.synopsis_tokens, 600),
            major_gc=s(self.major_gc, 1200),
            summary_chunk=s(self.summary_chunk, 1024),
            # the chronicler's instructions alone are ~700 tokens: a smaller prompt is mostly
            # instructions, so the bound never scales below what local-8k sends
            summary_prompt=s(self.summary_prompt, 1400) if self.summary_prompt else None,
            notes_tokens=s(self.notes_tokens, 128),
        )
        return out.fitted()

    def for_card(self, card_tokens: int) -> Profile:
        """This profile for a conversation whose system prompt (the card) takes `card_tokens`:
        memory's sizes and the headroom shrink together until card + memory + the minimum raw
        window fit under the ceiling, so a large card costs memory, never a failed turn. A card
        that cannot fit beside the minimum raw window and a minimal memory is refused."""
        room = self.ceiling - card_tokens - self.min_raw - MEMORY_FRAME_TOKENS
        parts = (
            self.synopsis_tokens,
            self.major_gc,
            self.chapter_tokens,
            self.notes_tokens,
            self.headroom,
        )
        need = sum(parts)
        if need <= room:
            return self
        floors = (MIN_ITEM_TOKENS, 2 * MIN_ITEM_TOKENS, MIN_ITEM_TOKENS, 0, MIN_ITEM_TOKENS)
        if room < sum(floors):
            from kioku.errors import CardTooLarge

            raise CardTooLarge(
                card_tokens,
                max(0, self.ceiling - self.min_raw - MEMORY_FRAME_TOKENS - sum(floors)),
                self,
            )
        k = room / need
        syn, gc, ch, notes, head = (max(f, int(v * k)) for v, f in zip(parts, floors, strict=True))
        return replace(
            self,
            synopsis_tokens=syn,
            major_gc=gc,
            chapter_tokens=ch,
            notes_tokens=notes,
            headroom=head,
        )

    def fitted(self) -> Profile:
        """This profile with memory's sizes shrunk together until synopsis + major GC + a chapter
        fit under the trigger beside the minimum raw window, and memory (those and the notes)
        takes at most `memory_share` of the ceiling. Scaling keeps floors that make memory items
        readable, but at a very small window those floors would not fit, and every turn would
        end in a forced cut; short of that, they would leave the conversation itself a sliver."""
        parts = self.synopsis_tokens + self.major_gc + self.chapter_tokens
        share = min(1.0, self.memory_share * self.ceiling / (parts + self.notes_tokens))
        k = min(share, (self.trigger - self.min_raw) / parts)
        if k >= 1:
            return self
        return replace(
            self,
            chapter_tokens=max(MIN_ITEM_TOKENS, int(self.chapter_tokens * k)),
            synopsis_tokens=max(MIN_ITEM_TOKENS, int(self.synopsis_tokens * k)),
            major_gc=max(2 * MIN_ITEM_TOKENS, int(self.major_gc * k)),
            notes_tokens=int(self.notes_tokens * share),
        )


LOCAL_64K = Profile(
    name="local-64k",
    window=65536,
    response_reserve=4096,
    trigger=54000,
    ceiling=61440,
    min_raw=10000,
    headroom=15400,
    chapter_tokens=900,
    synopsis_tokens=2400,
    major_gc=9600,
    summary_chunk=20000,
    summary_prompt=24000,
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
    summary_prompt=24000,
    notes_tokens=1500,
)

LOCAL_8K = Profile(
    name="local-8k",
    window=8192,
    response_reserve=1024,
    trigger=6300,
    ceiling=7168,
    min_raw=1200,
    headroom=1790,
    chapter_tokens=300,
    synopsis_tokens=600,
    major_gc=2000,
    summary_chunk=2500,
    # a rendered prompt of 1,400 tokens (~18 long English messages, ~35 short Japanese ones):
    # the local model this profile is for wrote grounded facts from a 900-token prompt, and
    # looped, copied or cut off on 2,100-2,300-token ones (docs/chronicler.md); a CPU reads
    # 1,400 in ~35 s when quiet
    summary_prompt=1400,
    notes_tokens=200,
    # the local model this profile is for took minutes for a first chapter on 2 CPU cores:
    # 300 s gave up on it (docs/configuration.md)
    summary_timeout_s=900.0,
    # its chapters answered worse than the extractive chronicler's (docs/results.md)
    reply_model_chronicles=False,
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
