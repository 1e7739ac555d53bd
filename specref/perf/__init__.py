"""Timing: pass costs, and speculative decoding measured against the theory (chapters 1, 4)."""
