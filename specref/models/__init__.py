"""Transformer models used as targets and drafts."""
