"""Grounding: every line a model writes into memory is read, in code, against what it cites.

How one line is judged, and where each step lives:

    a model's reply ─── records.record_from_reply / records.ground_record
          │                (each line of a record, one at a time)
          ▼
    Statement(text, seqs, speaker, about)        evidence.evidence_for / task_evidence
          │                                      (the span's messages, memory's names,
          │                                       the prompt's own words → check.Evidence)
          ▼
    check.Evidence.check(statement) ── the first rule that fails is the verdict's reason:
          seq          cites messages inside the span (or one is found for it)
          prompt       holds no run of the prompt's own words
          name         every name it uses occurs in the span or in memory
          author       whom it names as writer wrote a cited message
          empty        says something beyond names and framing words
          unsupported  its content stands in the cited messages: asked of the evidence's
                       judge (check.Judge; the default, check.WORD_READER, reads content
                       terms, numbers and negation: terms.read, one reading per language)
          │
          ▼
    Verdict(ok, reason) ── records: grounded lines kept; dropped ones listed with their
          │                reason and replaced by their message's own sentence
          ▼
    choice.choose / trim ── what a grounded record keeps within its target

`attribution.said_in` asks the narrower question for a note or fact: were its words said in
the message it cites. The modules import one another in one direction (terms → check →
evidence → records → choice; attribution → records; check → ngrams, asked: judges measured
beside the word reader by `kioku bench judge`) and nothing here imports the chronicler that
uses it.
"""
