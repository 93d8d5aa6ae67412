"""Measuring forgetting (SPEC §8): the instrument the seed changed its design by.

- `strategies`: kioku's arms replayed side by side on one conversation and budget;
  `baselines`: the arms without kioku's memory (truncation, plain retrieval, the full reference);
- `forgetting`: the forgetting curve, with an LLM writing, answering and grading questions;
- `locomo`: the LLM-free proxy on LoCoMo (is the gold answer in the context, strictly?), and
  `diagnosis`: where each arm's answers come from, and what it loses against retrieval;
- `audit`: claims written as facts, threads left open (`threads`: without a model), notes
  (`notecheck`), tics and attribution in memory;
- `answers`: answer normalization, the strict / F1 / bag-of-words matches, LoCoMo's F1;
- `qa`: the evaluation's model calls; `plots`, `report`: PNGs and a Markdown report;
  `cli`: the `kioku eval` commands and `demo`.
"""
