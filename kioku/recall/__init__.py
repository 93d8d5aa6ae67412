"""Archive recall, the fourth memory layer (seed 003): the past exchanges a new message wants,
found in the whole log and shown beside the message as recollections.

One module a concept:
- `archive`: the BM25 index of the log (kioku's terms: stemmed English, CJK bigrams), `Hit`;
- `indexes`: an index per conversation kept in step with the log (`RecallIndexes`), and the
  exchanges a set of hits becomes within a budget (`exchanges`);
- `need`: whether a turn wants the past, and how much (`judge`: the gate, pure);
- `shown`: what the prompt already shows (raw window, memory), so nothing is shown twice;
- `recollection`: the values recollections are (`Recollection`, `RecalledLine`).
The index's segments live in the store (`kioku.store.segments`); `kioku.layers.Layers` runs it
all behind the turn hooks.
"""

from kioku.recall.archive import Hit
from kioku.recall.indexes import EXCHANGE_TOKENS, RecallIndexes, exchanges
from kioku.recall.need import Need, Recall, judge
from kioku.recall.recollection import RecalledLine, Recollection

__all__ = [
    "EXCHANGE_TOKENS",
    "Hit",
    "Need",
    "Recall",
    "RecalledLine",
    "Recollection",
    "RecallIndexes",
    "exchanges",
    "judge",
]
