"""Training a draft on the frozen target, live: Medusa heads in a minute on a CPU (chapter 5).

Rule (Medusa-1 with self-distillation, as `tools/training/train_heads.py` trains the shipped
heads, reduced): the target is frozen; its top feature f_t (`hidden_states[n_layer]`) is computed
once for a set of training windows. Head i (0-based) reads f_t and is trained so that
lm_head(head_i(f_t)) matches the target's own next-token distribution for x_{t+2+i}, which is
lm_head(f_{t+1+i}): soft cross-entropy against it, on `rows` random rows per head and step.
AdamW, a short linear warm-up, then a constant rate.

Why Medusa: a head reads one feature and no sequence, so once the target's features are cached a
step costs a few small matrix products and the LM head over `rows` rows per head (64 by default),
far less than one target pass. The heads start as the target's own next-token head (`MedusaHeads`
starts at zero): at step 0 head i guesses x_{t+1} where x_{t+2+i} is wanted and almost nothing is
accepted, the baseline training moves from.

The text: the bundled pair was trained on the `.py` files of the Python standard library, which
the package does not ship; every Python installation has its own copy. `training_files` reads this
interpreter's standard library and keeps the training side of the pair's split (a file is held
out when ``sha256(relative path)[:8] % 10000 < 200``), so the held-out prompts the course
evaluates on are never trained on. Another Python version has somewhat other files.

Seeded: windows, rows and nothing else are drawn from the `torch.Generator` given (the heads start
at zero); the global RNG is never touched. The same seed on the same machine gives the same weights.
"""

from __future__ import annotations

import hashlib
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from .._validate import check_gpt2, check_int
from ..models.pair import bundled_tokenizer
from .heads import MedusaHeads

# The pair's held-out rule (tools/training/train_pair.py): bucket < HELDOUT_BUCKETS of 10000 is held out.
HELDOUT_BUCKETS = 200
MAX_FILE_BYTES = 400_000  # the pair's corpus skipped larger files
_SKIPPED_DIRS = ("site-packages", "dist-packages", "__pycache__")


def is_heldout(relpath: str) -> bool:
    """Whether the pair's split holds this standard-library file out of training (its path's sha256 bucket)."""
    if not isinstance(relpath, str):
        raise TypeError(f"relpath must be a str, got {type(relpath).__name__}")
    return int.from_bytes(hashlib.sha256(relpath.encode()).digest()[:8], "big") % 10000 < HELDOUT_BUCKETS


def training_files(root: str | Path | None = None) -> list[Path]:
    """The training side of the pair's split of the standard library under `root` (default: this Python's), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"] if root is None else root)
    if not root.is_dir():
        raise ValueError(f"root must be a directory of Python source files, got {str(root)!r}")
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in _SKIPPED_DIRS for part in rel.parts[:-1]) or is_heldout(rel.as_posix()):
            continue
        if path.stat().st_size <= MAX_FILE_BYTES:
            files.append(path)
    if not files:
        raise ValueError(f"no training files under {str(root)!r}")
    return files


def training_windows(
    n_windows: int, ctx: int, generator: torch.Generator, files: list[Path] | None = None
) -> torch.Tensor:  # [n_windows, ctx] long
    """n_windows windows of ctx tokens, each from a random training file (`training_files`), at a random offset.

    Files shorter than ctx tokens are passed over. Every draw comes from `generator`.
    """
    n_windows = check_int("n_windows", n_windows, 1, "training windows")
    ctx = check_int("ctx", ctx, 2, "tokens per window")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    files = training_files() if files is None else files
    tok = bundled_tokenizer()
    windows: list[torch.Tensor] = []
    tries = 0
    while len(windows) < n_windows:
        tries += 1
        if tries > 50 * n_windows:
            raise ValueError(f"too few training files hold {ctx} tokens: lower ctx")
        path = files[int(torch.randint(len(files), (), generator=generator))]
        try:
            ids = tok.encode(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
        if len(ids) < ctx:
            continue
        start = int(torch.randint(len(ids) - ctx + 1, (), generator=generator))
        windows.append(torch.tensor(ids[start : start + ctx]))
    return torch.stack(windows)


@dataclass
class TrainRecord:
    """What a training run did: steps, seconds of training (features excluded), the loss of every step."""

    n_heads: int
    lr: float
    rows: int
    windows: int
    ctx: int
    steps: int = 0
    seconds: float = 0.0
    feature_seconds: float = 0.0  # the frozen target's one pass over the windows
    losses: list[float] = field(default_factory=list)  # the mean soft cross-entropy over heads, per step


class MedusaTrainer:
    """Medusa heads trained on the frozen `target` (module docstring); `train(steps)` continues where it stopped.

    `heads` (a `MedusaHeads`, float32, on the CPU) and `record` (a `TrainRecord`) are the state.
    The target's features over `n_windows` windows of `ctx` tokens are computed once, in
    float32, when the trainer is made; batches of `rows` rows per head are drawn from `generator`.
    """

    def __init__(
        self,
        target: torch.nn.Module,
        generator: torch.Generator,
        n_heads: int = 3,
        n_windows: int = 256,
        ctx: int = 128,
        rows: int = 64,
        lr: float = 3e-3,
        warmup: int = 10,
        windows: torch.Tensor | None = None,  # [N, T] training windows; default `training_windows`
    ) -> None:
        target = check_gpt2(target)
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        n_heads = check_int("n_heads", n_heads, 1, "Medusa heads")
        self.rows = check_int("rows", rows, 1, "rows per head and step")
        self.warmup = check_int("warmup", warmup, 0, "warm-up steps")
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
            raise ValueError(f"lr must be a number > 0, got {lr!r}")
        if windows is None:
            windows = training_windows(n_windows, ctx, generator)
        if not isinstance(windows, torch.Tensor) or windows.ndim != 2 or windows.shape[1] < n_heads + 2:
            raise ValueError(f"windows must be a [N, T] tensor of token ids with T >= n_heads + 2, got "
                             f"{getattr(windows, 'shape', windows)!r}")
        self.generator = generator
        t0 = time.perf_counter()
        lm_head = target.lm_head
        with torch.no_grad():  # the frozen target, once: its top feature at every row, in float32
            hs = [target(w.to(target.device), return_hidden=True).hidden_states[-1] for w in windows.split(16)]
            self.features = torch.cat(hs).to(device="cpu", dtype=torch.float32)  # [N, T, C]
            self.lm_weight = lm_head.weight.detach().to(device="cpu", dtype=torch.float32)  # [V, C]
        C = self.features.shape[-1]
        self.heads = MedusaHeads(C, n_heads)
        self.optimizer = torch.optim.AdamW(self.heads.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
        self.lr = float(lr)
        self.record = TrainRecord(n_heads, float(lr), self.rows, int(windows.shape[0]), int(windows.shape[1]),
                                  feature_seconds=time.perf_counter() - t0)

    def loss(self) -> torch.Tensor:
        """One batch's loss: the mean over heads of the soft cross-entropy against the target's distribution."""
        f = self.features
        N, T, C = f.shape
        n = self.heads.n_heads
        terms = []
        for i in range(n):  # head i at row t predicts x_{t+2+i}: its label is the target's distribution at t+1+i
            b = torch.randint(N, (self.rows,), generator=self.generator)
            t = torch.randint(T - 1 - i, (self.rows,), generator=self.generator)
            with torch.no_grad():  # p at t+1+i, the target's distribution for x_{t+2+i}
                label = F.softmax(f[b, t + 1 + i] @ self.lm_weight.T, -1)  # [rows, V]
            z = f[b, t] @ self.heads.weight[i] + self.heads.bias[i]  # [rows, C]: head i alone (MedusaHeads.forward)
            out = f[b, t] + F.silu(z)
            terms.append(F.cross_entropy(out @ self.lm_weight.T, label))
        return torch.stack(terms).mean()

    def train(self, steps: int) -> TrainRecord:
        """`steps` more optimizer steps; returns the record (cumulative)."""
        steps = check_int("steps", steps, 0, "optimizer steps")
        t0 = time.perf_counter()
        for _ in range(steps):
            done = self.record.steps
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr * min(1.0, (done + 1) / (self.warmup + 1))
            loss = self.loss()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.heads.parameters(), 1.0)
            self.optimizer.step()
            self.record.steps += 1
            self.record.losses.append(loss.item())
        self.record.seconds += time.perf_counter() - t0
        return self.record

    def heads_copy(self, dtype: torch.dtype = torch.float64, device: torch.device | str = "cpu") -> MedusaHeads:
        """The heads as they are now, copied to `dtype` and `device` (training goes on with the originals)."""
        heads = MedusaHeads(self.heads.n_embd, self.heads.n_heads)
        heads.load_state_dict(self.heads.state_dict())
        return heads.to(device=device, dtype=dtype).eval().requires_grad_(False)


def train_medusa(
    target: torch.nn.Module, steps: int, generator: torch.Generator, **options: object
) -> tuple[MedusaHeads, TrainRecord]:
    """Medusa heads trained `steps` steps on the frozen target (`MedusaTrainer(target, generator, **options)`)."""
    trainer = MedusaTrainer(target, generator, **options)
    record = trainer.train(steps)
    return trainer.heads.eval(), record
