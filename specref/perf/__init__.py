"""Measurement: pass costs, speculative decoding measured against the theory (chapters 1, 4), and
acceptance measured along a text by kind of text (chapter 8)."""
