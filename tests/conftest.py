"""Shared test settings."""

import torch

# Two cores, many small ops: one intra-op thread avoids oversubscription (and is much faster).
torch.set_num_threads(1)
