"""Measuring forgetting (SPEC §8): the instrument the seed changed its design by.

- `strategies`: kioku and its baselines replayed side by side on one conversation and budget;
- `forgetting`: the forgetting curve, with an LLM writing, answering and grading questions;
- `locomo`: the LLM-free proxy on LoCoMo (is the gold answer in the context at all?);
- `audit`: claims written as facts, threads left open, tics and attribution in memory;
- `answers`: answer normalization, containment and LoCoMo's F1;
- `plots`, `report`: PNGs and a Markdown report; `cli`: the `kioku eval` commands and `demo`.
"""
