"""specref: a small, verified reference implementation of speculative decoding."""
