"""Aligning a client's transcript with the log's tail in about linear time.

`kioku.sync.diff` reads the edit script between the log's tail and a stateless client's
transcript (both as message keys) from `difflib.SequenceMatcher` opcodes. SequenceMatcher is exact
but quadratic when keys repeat: 20,000 messages of "ok" took 31 s of CPU, and a 100,000-message
body 175 s. A stateless client's transcript is almost always the log's tail with a few changes,
so this module finds the same kind of opcodes the way patience diff does:

1. match the common prefix and suffix;
2. anchor on keys that occur once on each side, in an order both agree on (the longest
   increasing subsequence of their positions);
3. do the same between consecutive anchors, and hand regions small enough to SequenceMatcher.

Inputs up to `EXACT_LIMIT` (length × length) go to SequenceMatcher whole, so ordinary requests
get exactly the opcodes they always got. A large region with no unique key and no common end
(thousands of identical messages in a different place on each side) stays unmatched: `diff` then
refuses it as a conflict instead of spending minutes on it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Hashable, Sequence
from difflib import SequenceMatcher

Opcode = tuple[str, int, int, int, int]
Block = tuple[int, int, int]  # (i in a, j in b, length)

EXACT_LIMIT = 250_000


def opcodes(
    a: Sequence[Hashable], b: Sequence[Hashable], exact_limit: int = EXACT_LIMIT
) -> list[Opcode]:
    """SequenceMatcher-style opcodes turning `a` into `b`; regions of at most `exact_limit`
    (length × length) are matched exactly."""
    if len(a) * len(b) <= exact_limit:
        return list(SequenceMatcher(None, a, b, autojunk=False).get_opcodes())
    blocks: list[Block] = []
    regions = [(0, len(a), 0, len(b))]
    while regions:
        regions.extend(_match(a, b, *regions.pop(), exact_limit, blocks))
    return _opcodes(sorted(blocks), len(a), len(b))


def _match(
    a: Sequence[Hashable],
    b: Sequence[Hashable],
    alo: int,
    ahi: int,
    blo: int,
    bhi: int,
    exact_limit: int,
    blocks: list[Block],
) -> list[tuple[int, int, int, int]]:
    """Record the blocks found in one region; return the sub-regions still to align."""
    n = 0
    while alo + n < ahi and blo + n < bhi and a[alo + n] == b[blo + n]:
        n += 1
    if n:
        blocks.append((alo, blo, n))
        alo, blo = alo + n, blo + n
    n = 0
    while ahi - n > alo and bhi - n > blo and a[ahi - n - 1] == b[bhi - n - 1]:
        n += 1
    if n:
        blocks.append((ahi - n, bhi - n, n))
        ahi, bhi = ahi - n, bhi - n
    if alo == ahi or blo == bhi:
        return []
    if (ahi - alo) * (bhi - blo) <= exact_limit:
        matcher = SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
        blocks.extend((alo + i, blo + j, k) for i, j, k in matcher.get_matching_blocks() if k)
        return []
    anchors = _anchors(a, b, alo, ahi, blo, bhi)
    if not anchors:
        return []
    regions = []
    pi, pj = alo, blo
    for i, j in anchors:
        blocks.append((i, j, 1))
        regions.append((pi, i, pj, j))
        pi, pj = i + 1, j + 1
    regions.append((pi, ahi, pj, bhi))
    return [r for r in regions if r[0] < r[1] and r[2] < r[3]]


def _anchors(
    a: Sequence[Hashable], b: Sequence[Hashable], alo: int, ahi: int, blo: int, bhi: int
) -> list[tuple[int, int]]:
    """Pairs (i, j) of keys unique on both sides, increasing in both (the longest such run)."""
    in_a = Counter(a[alo:ahi])
    in_b = Counter(b[blo:bhi])
    where_a = {a[i]: i for i in range(alo, ahi) if in_a[a[i]] == 1}
    pairs = [(where_a[b[j]], j) for j in range(blo, bhi) if in_b[b[j]] == 1 and b[j] in where_a]
    return _increasing(pairs)


def _increasing(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest subsequence of `pairs` (sorted by j) whose i also increases."""
    tails: list[int] = []  # tails[k]: the smallest i ending an increasing run of length k+1
    ends: list[int] = []  # ...and the index in `pairs` of that pair
    back = [-1] * len(pairs)
    for n, (i, _) in enumerate(pairs):
        k = bisect_left(tails, i)
        if k == len(tails):
            tails.append(i)
            ends.append(n)
        else:
            tails[k] = i
            ends[k] = n
        back[n] = ends[k - 1] if k else -1
    run: list[tuple[int, int]] = []
    n = ends[-1] if ends else -1
    while n >= 0:
        run.append(pairs[n])
        n = back[n]
    return run[::-1]


def _opcodes(blocks: list[Block], la: int, lb: int) -> list[Opcode]:
    merged: list[Block] = []
    for i, j, k in blocks:
        if merged and merged[-1][0] + merged[-1][2] == i and merged[-1][1] + merged[-1][2] == j:
            pi, pj, pk = merged[-1]
            merged[-1] = (pi, pj, pk + k)
        else:
            merged.append((i, j, k))
    out: list[Opcode] = []
    i = j = 0
    for ai, bj, size in [*merged, (la, lb, 0)]:
        tag = "replace" if i < ai and j < bj else "delete" if i < ai else "insert" if j < bj else ""
        if tag:
            out.append((tag, i, ai, j, bj))
        i, j = ai + size, bj + size
        if size:
            out.append(("equal", ai, i, bj, j))
    return out
