"""Plain, speculative (chain) and tree decoding with KV caches, and the step trace (chapters 4 and 6)."""
