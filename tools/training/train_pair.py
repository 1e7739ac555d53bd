"""Train the bundled target/draft GPT-2 pair on the Python standard library's source.

    python tools/training/train_pair.py --minutes 85            # tokenizer + draft + target + record
    python tools/training/train_pair.py --export-only           # finish from the last checkpoints

On a busy machine the two models can train in separate 1-thread processes, in
phases that resume from the checkpoints in ``--work``:

    python tools/training/train_pair.py --models draft --resume draft --threads 1 --minutes 30 --no-final
    python tools/training/train_pair.py --models target --threads 1 --minutes 70   # then evaluates + writes the pair

Steps: (1) collect the stdlib ``.py`` files and split them by a hash of their
relative path (deterministic, ~2% held out); (2) train a byte-level BPE on the
training files; (3) train the draft, then the target, each for its share of a
wall-clock budget with AdamW, linear warm-up and cosine decay *in elapsed time*
(so a slower machine gets fewer steps but still ends with a decayed LR);
(4) evaluate held-out perplexity and the greedy acceptance rate alpha; (5) write
``config.json`` + ``model.safetensors`` per model, ``tokenizer.json`` and a
training record into ``specref/assets``.

Reproducibility: the seed fixes init and batch order, but the number of steps
depends on the machine's speed and the corpus on the Python version, so a
rerun reproduces the pair only approximately.  The record says exactly what
this run saw.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specref.models.gpt2 import GPT2, GPT2Config  # noqa: E402
from specref.models.tokenizer import BPETokenizer, load_tokenizer, train_tokenizer  # noqa: E402

TEST_DIRS = {"test", "tests", "idle_test"}


# -- corpus ------------------------------------------------------------------------------
def collect_corpus(include_tests: bool, max_file_bytes: int, heldout_percent: float):
    """Sorted (relpath, text) of stdlib .py files, split into train / held-out by sha256(relpath)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")
                             and (include_tests or d not in TEST_DIRS))
        for name in sorted(filenames):
            if name.endswith(".py"):
                files.append(Path(dirpath) / name)
    train, heldout, skipped = [], [], []
    listing = hashlib.sha256()
    for path in sorted(files):
        rel = path.relative_to(root).as_posix()
        raw = path.read_bytes()
        if len(raw) > max_file_bytes:
            skipped.append(rel)
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(rel)
            continue
        listing.update(rel.encode() + b"\0" + hashlib.sha256(raw).digest())
        bucket = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big") % 10000
        (heldout if bucket < heldout_percent * 100 else train).append((rel, text))
    info = {
        "python_version": platform.python_version(),
        "stdlib_root": str(root),
        "include_tests": include_tests,
        "max_file_bytes": max_file_bytes,
        "heldout_rule": f"sha256(relative path)[:8] as big-endian int % 10000 < {int(heldout_percent * 100)}",
        "n_files_train": len(train),
        "n_files_heldout": len(heldout),
        "skipped_files": skipped,
        "heldout_files": [r for r, _ in heldout],
        "chars_train": sum(len(t) for _, t in train),
        "chars_heldout": sum(len(t) for _, t in heldout),
        "file_list_sha256": listing.hexdigest(),
    }
    return train, heldout, info


def encode_stream(tok: BPETokenizer, docs: list[tuple[str, str]]) -> torch.Tensor:
    """All documents' ids, each followed by <|endoftext|>, as one int32 stream."""
    ids: list[int] = []
    for enc in tok.tok.encode_batch([t for _, t in docs]):
        ids.extend(enc.ids)
        ids.append(tok.eot_id)
    return torch.tensor(ids, dtype=torch.int32)


# -- training ------------------------------------------------------------------------------
def lr_at(progress: float, lr: float, warmup: float, min_ratio: float) -> float:
    """Linear warm-up for the first ``warmup`` fraction of the budget, then cosine to ``min_ratio * lr``."""
    if progress < warmup:
        return lr * max(progress / warmup, 0.01)
    t = min((progress - warmup) / (1 - warmup), 1.0)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def eval_windows(stream: torch.Tensor, ctx: int, n: int) -> torch.Tensor:
    """``n`` evenly spaced, non-random windows of ctx+1 tokens: the fixed held-out set."""
    n = min(n, (len(stream) - 1) // (ctx + 1))
    starts = torch.linspace(0, len(stream) - ctx - 2, n).long()
    return torch.stack([stream[s:s + ctx + 1] for s in starts.tolist()]).long()  # [n, ctx+1]


@torch.no_grad()
def heldout_loss(model: GPT2, windows: torch.Tensor, batch: int, device: str) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        w = windows[i:i + batch].to(device)
        logits = model(w[:, :-1])
        total += F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
        count += w[:, 1:].numel()
    return total / count


def train_model(name: str, model: GPT2, train_stream: torch.Tensor, val_windows: torch.Tensor,
                args, minutes: float, lr: float, work: Path, log, resume: dict | None = None,
                teacher: GPT2 | None = None) -> dict:
    """Train for a wall-clock budget; with a teacher, the loss is the KL divergence from its predictions."""
    device, ctx, B = args.device, args.ctx, args.batch_size
    phase = len(resume["phases"]) if resume else 0
    # A resumed phase draws other batches than the first one did.
    gen = torch.Generator().manual_seed(args.seed + (0 if name == "target" else 1) + 100 * phase)
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.ndim >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    budget = minutes * 60.0
    start = time.time()
    next_eval = start + args.eval_every_min * 60
    step0, tokens0 = (resume["step"], resume["tokens"]) if resume else (0, 0)
    step, tokens = step0, tokens0
    history = list(resume["history"]) if resume else []
    phases = list(resume["phases"]) if resume else []
    phases.append({"minutes_budget": minutes, "lr": lr, "threads": args.threads, "start_step": step0,
                   "loss": "cross-entropy on the text" if teacher is None else "KL(target || draft), distillation"})
    bar = tqdm(total=int(budget), desc=f"{name}", unit="s", mininterval=10, file=sys.stdout)
    model.train()
    while True:
        elapsed = time.time() - start
        if elapsed >= budget:
            break
        cur_lr = lr_at(elapsed / budget, lr, args.warmup_frac, args.min_lr_ratio)  # schedule restarts per phase
        for g in opt.param_groups:
            g["lr"] = cur_lr
        starts = torch.randint(0, len(train_stream) - ctx - 1, (B,), generator=gen)
        batch = torch.stack([train_stream[s:s + ctx + 1] for s in starts.tolist()]).long().to(device)
        logits = model(batch[:, :-1])
        if teacher is None:
            loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        else:  # distillation: match the teacher's whole next-token distribution, KL(teacher || model)
            with torch.no_grad():
                teacher_logp = F.log_softmax(teacher(batch[:, :-1]), -1).flatten(0, 1)
            loss = F.kl_div(F.log_softmax(logits, -1).flatten(0, 1), teacher_logp, log_target=True,
                            reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        tokens += B * ctx
        bar.update(int(time.time() - start) - bar.n)
        if step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{cur_lr:.2e}", tok=f"{tokens / 1e6:.2f}M",
                            tps=f"{(tokens - tokens0) / (time.time() - start):.0f}")
        if time.time() >= next_eval:
            vl = heldout_loss(model, val_windows, 16, device)
            model.train()
            history.append({"phase": len(phases) - 1, "step": step, "tokens": tokens,
                            "minutes": (time.time() - start) / 60, "train_loss": loss.item(), "heldout_loss": vl})
            log(f"[{name}] step {step} tokens {tokens} train {loss.item():.4f} heldout {vl:.4f} "
                f"ppl {math.exp(vl):.3f} lr {cur_lr:.2e}")
            torch.save({"config": model.config.to_dict(), "state_dict": model.state_dict(), "step": step,
                        "tokens": tokens, "history": history, "phases": phases}, work / f"ckpt_{name}.pt")
            next_eval = time.time() + args.eval_every_min * 60
    bar.close()
    vl = heldout_loss(model, val_windows, 16, device)
    history.append({"phase": len(phases) - 1, "step": step, "tokens": tokens,
                    "minutes": (time.time() - start) / 60, "heldout_loss": vl})
    phases[-1].update(end_step=step, minutes=round((time.time() - start) / 60, 2), tokens=tokens - tokens0)
    torch.save({"config": model.config.to_dict(), "state_dict": model.state_dict(), "step": step,
                "tokens": tokens, "history": history, "phases": phases}, work / f"ckpt_{name}.pt")
    log(f"[{name}] done: {step} steps, {tokens} tokens, {(time.time() - start) / 60:.1f} min, "
        f"heldout loss {vl:.4f} ppl {math.exp(vl):.3f}")
    return {"steps": step, "tokens_seen": tokens, "minutes": round(sum(ph["minutes"] for ph in phases), 2),
            "lr": lr, "history": history, "phases": phases}


# -- evaluation of the pair ---------------------------------------------------------------
@torch.no_grad()
def greedy_alpha(target: GPT2, draft: GPT2, stream: torch.Tensor, n_prompts: int, prompt_len: int,
                 gen_len: int, device: str) -> dict:
    """Greedy agreement of draft and target on held-out prompts.

    ``alpha_on_target_greedy``: the target continues each prompt greedily for
    ``gen_len`` tokens; alpha is the fraction of those positions where the
    draft's argmax (given the same prefix) equals the target's token -- the
    per-token acceptance rate of greedy speculative decoding.
    ``alpha_on_heldout_text``: the same agreement of the two argmaxes with the
    real held-out text as the prefix.
    """
    target.eval(), draft.eval()
    windows = eval_windows(stream, prompt_len + gen_len - 1, n_prompts).to(device)  # [n, P+G]
    prompts = windows[:, :prompt_len]
    cache = target.new_cache(len(prompts), max_len=prompt_len + gen_len)
    logits = target(prompts, cache=cache)
    seq = [logits[:, -1].argmax(-1)]
    for _ in range(gen_len - 1):
        seq.append(target(seq[-1][:, None], cache=cache)[:, -1].argmax(-1))
    cont = torch.stack(seq, 1)  # [n, G]
    full = torch.cat([prompts, cont], 1)
    d_pred = draft(full[:, :-1])[:, prompt_len - 1:].argmax(-1)  # [n, G]
    a_greedy = (d_pred == cont).float().mean().item()
    text = windows[:, :-1]
    t_arg = target(text)[:, prompt_len - 1:].argmax(-1)
    d_arg = draft(text)[:, prompt_len - 1:].argmax(-1)
    a_text = (t_arg == d_arg).float().mean().item()
    # Expected accepted run per step for k drafts under an i.i.d. alpha (section 3's formula).
    return {"alpha_on_target_greedy": round(a_greedy, 4), "alpha_on_heldout_text": round(a_text, 4),
            "n_prompts": len(prompts), "prompt_len": prompt_len, "gen_len": gen_len}


# -- export ----------------------------------------------------------------------------------
def export(model: GPT2, folder: Path, dtype: torch.dtype) -> int:
    """HF layout: config.json + model.safetensors (tied lm_head omitted, as HF does)."""
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu", dtype).contiguous().clone()
          for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return (folder / "model.safetensors").stat().st_size


def write_markdown(record: dict, path: Path) -> None:
    t, d, ev = record["models"]["target"], record["models"]["draft"], record["eval"]
    lines = [
        "# The bundled GPT-2 pair: how it was trained",
        "",
        "Generated by `tools/training/train_pair.py`; the full record is `TRAINING.json`.",
        "",
        f"- Corpus: the `.py` files of the Python {record['corpus']['python_version']} standard library "
        f"(site-packages excluded, test directories {'included' if record['corpus']['include_tests'] else 'excluded'}), "
        f"{record['corpus']['n_files_train']} training files / {record['corpus']['n_files_heldout']} held-out files, "
        f"split by `{record['corpus']['heldout_rule']}`.",
        f"- File list hash: `{record['corpus']['file_list_sha256']}`. Another Python version has other "
        "files, so a rerun elsewhere reproduces the pair only approximately (and the step count depends on "
        "machine speed, since the schedule is a wall-clock budget).",
        f"- Tokenizer: byte-level BPE, vocabulary {record['tokenizer']['vocab_size']}, "
        f"`<|endoftext|>` = {record['tokenizer']['eot_id']}; {record['tokens']['train']} training tokens, "
        f"{record['tokens']['heldout']} held-out tokens.",
        "",
        *(["Commands of this run, in order: " + "; ".join(f"`{c}`" for c in record["commands"]), ""]
          if record.get("commands") else []),
        "| model | layers x width (heads) | parameters | steps | tokens seen | minutes | held-out loss | held-out ppl |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m in (("target", t), ("draft", d)):
        c = m["config"]
        lines.append(f"| {name} | {c['n_layer']} x {c['n_embd']} ({c['n_head']}) | {m['parameters']:,} | "
                     f"{m['steps']} | {m['tokens_seen']:,} | {m['minutes']} | {m['heldout_loss']:.4f} | "
                     f"{m['heldout_ppl']:.3f} |")
    lines += [
        "",
        f"- Greedy alpha (draft argmax = target token along the target's greedy continuation of "
        f"{ev['n_prompts']} held-out prompts of {ev['prompt_len']} tokens, {ev['gen_len']} tokens each): "
        f"**{ev['alpha_on_target_greedy']}**.",
        f"- Agreement of the two argmaxes along the held-out text itself: {ev['alpha_on_heldout_text']}.",
        f"- Optimiser: AdamW (betas 0.9/0.95, weight decay {record['args']['weight_decay']} on matrices), "
        f"linear warm-up then cosine decay over the wall-clock budget, grad-norm clip "
        f"{record['args']['grad_clip']}, batch {record['args']['batch_size']} x {record['args']['ctx']} tokens, "
        f"seed {record['args']['seed']}, on `{record['machine']}`.",
        f"- Weights stored as {record['args']['save_dtype']} safetensors; load in fp32 with "
        "`specref.models.load_pair()`.",
    ]
    for name, m in (("target", t), ("draft", d)):
        phases = m.get("phases") or []
        if len(phases) > 1:
            parts = [f"{ph.get('minutes', '?')} min" + (f" on {ph['threads']} thread(s)" if "threads" in ph else "")
                     + (f", LR {ph['lr']}" if "lr" in ph else "") + (f", {ph['loss']}" if "loss" in ph else "")
                     for ph in phases]
            lines.append(f"- The {name} was trained in {len(phases)} phases ({'; '.join(parts)}), each resuming "
                         "from the previous checkpoint with a fresh warm-up + cosine schedule.")
    if record.get("note"):
        lines += ["", record["note"]]
    lines.append("")
    path.write_text("\n".join(lines))


def open_log(work: Path) -> Callable[[str], None]:
    """A log function: each message, time-stamped, to stdout and appended to work/train.log."""
    logf = open(work / "train.log", "a")

    def log(msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    return log


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "specref" / "assets"))
    p.add_argument("--work", default=str(ROOT / ".train"))
    p.add_argument("--minutes", type=float, default=85.0, help="wall-clock budget for draft + target training")
    p.add_argument("--draft-frac", type=float, default=0.12, help="share of the budget for the draft")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--include-tests", type=int, default=1)
    p.add_argument("--max-file-bytes", type=int, default=400_000)
    p.add_argument("--heldout-percent", type=float, default=2.0)
    p.add_argument("--target-layers", type=int, default=6)
    p.add_argument("--target-embd", type=int, default=256)
    p.add_argument("--target-heads", type=int, default=4)
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--draft-embd", type=int, default=128)
    p.add_argument("--draft-heads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--target-lr", type=float, default=1.5e-3)
    p.add_argument("--draft-lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--warmup-frac", type=float, default=0.03)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--eval-every-min", type=float, default=8.0)
    p.add_argument("--eval-windows", type=int, default=128)
    p.add_argument("--alpha-prompts", type=int, default=32)
    p.add_argument("--save-dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--export-only", action="store_true", help="skip training; export the checkpoints in --work")
    p.add_argument("--models", default="draft,target",
                   help="which models to train here; the others are read from their checkpoints in --work")
    p.add_argument("--resume", default="", help="models to initialise from their checkpoints (a new LR phase)")
    p.add_argument("--record-only", action="store_true", help="only rewrite TRAINING.md from TRAINING.json")
    p.add_argument("--distill", action="store_true",
                   help="train the draft to match the target checkpoint in --work (KL), not the text")
    p.add_argument("--no-final", action="store_true",
                   help="only train (and checkpoint) --models; skip the final evaluation and record")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    work, out = Path(args.work), Path(args.out)
    if args.record_only:
        write_markdown(json.loads((out / "TRAINING.json").read_text()), out / "TRAINING.md")
        return
    work.mkdir(parents=True, exist_ok=True)
    log = open_log(work)
    log(f"args: {vars(args)}")
    t0 = time.time()
    train_docs, heldout_docs, corpus = collect_corpus(bool(args.include_tests), args.max_file_bytes,
                                                      args.heldout_percent)
    log(f"corpus: {corpus['n_files_train']} train / {corpus['n_files_heldout']} held-out files, "
        f"{corpus['chars_train'] / 1e6:.1f}M / {corpus['chars_heldout'] / 1e6:.2f}M chars")

    tok_path = work / "tokenizer.json"
    tok_key = work / "tokenizer.key"
    key = f"{corpus['file_list_sha256']}:{args.vocab_size}:{args.heldout_percent}"
    if tok_path.exists() and tok_key.exists() and tok_key.read_text() == key:
        tok = load_tokenizer(tok_path)
        log("tokenizer: reused")
    else:
        tok = train_tokenizer((t for _, t in train_docs), vocab_size=args.vocab_size)
        tok.save(tok_path)
        tok_key.write_text(key)
        log(f"tokenizer: trained in {time.time() - t0:.0f}s")
    tokens_path = work / "tokens.pt"
    if tokens_path.exists() and torch.load(tokens_path)["key"] == key:
        blob = torch.load(tokens_path)
    else:
        blob = {"key": key, "train": encode_stream(tok, train_docs), "heldout": encode_stream(tok, heldout_docs)}
        torch.save(blob, tokens_path)
    train_stream, heldout_stream = blob["train"], blob["heldout"]
    log(f"tokens: train {len(train_stream)} heldout {len(heldout_stream)} "
        f"({corpus['chars_train'] / len(train_stream):.2f} chars/token); setup {time.time() - t0:.0f}s")
    val_windows = eval_windows(heldout_stream, args.ctx, args.eval_windows)

    def make(layers: int, embd: int, heads: int, seed: int) -> GPT2:
        torch.manual_seed(seed)  # init only; batches use their own generators
        cfg = GPT2Config(vocab_size=tok.vocab_size, n_positions=args.ctx, n_embd=embd, n_layer=layers,
                         n_head=heads, bos_token_id=tok.eot_id, eos_token_id=tok.eot_id)
        return GPT2(cfg).to(args.device)

    results = {}
    models = {}
    specs = [
        ("draft", args.draft_layers, args.draft_embd, args.draft_heads, args.draft_lr, args.draft_frac),
        ("target", args.target_layers, args.target_embd, args.target_heads, args.target_lr, 1 - args.draft_frac),
    ]
    # Models trained here go first, so that a checkpoint written meanwhile by another
    # process (e.g. a draft trained in parallel) is read only after our training ends.
    specs.sort(key=lambda spec: args.export_only or spec[0] not in args.models.split(","))
    for name, layers, embd, heads, lr, share in specs:
        train_here = not args.export_only and name in args.models.split(",")
        if not train_here and args.no_final:
            continue
        model = make(layers, embd, heads, args.seed + (1 if name == "draft" else 0))
        log(f"[{name}] {layers}x{embd} ({heads} heads), {model.num_parameters():,} parameters")
        ck = None
        if not train_here or name in args.resume.split(","):
            ck = torch.load(work / f"ckpt_{name}.pt")
            ck.setdefault("phases", [{"minutes": round(ck["history"][-1]["minutes"], 2)}])
            model.load_state_dict(ck["state_dict"])
            log(f"[{name}] loaded checkpoint: step {ck['step']}, {ck['tokens']} tokens")
        if train_here:
            minutes = args.minutes if args.models != "draft,target" else args.minutes * share
            teacher = None
            if name == "draft" and args.distill:
                teacher = make(args.target_layers, args.target_embd, args.target_heads, args.seed)
                teacher.load_state_dict(torch.load(work / "ckpt_target.pt")["state_dict"])
                teacher.eval().requires_grad_(False)
                log("[draft] distilling from the target checkpoint")
            results[name] = train_model(name, model, train_stream, val_windows, args, minutes, lr, work, log,
                                        resume=ck, teacher=teacher)
            export(model, out / name, getattr(torch, args.save_dtype))  # early copy, in case we are stopped
        else:
            results[name] = {"steps": ck["step"], "tokens_seen": ck["tokens"], "history": ck["history"],
                             "phases": ck["phases"], "lr": lr,
                             "minutes": round(sum(ph.get("minutes", 0) for ph in ck["phases"]), 2)}
        models[name] = model.eval()

    if args.no_final:
        log("--no-final: done")
        return
    # Final evaluation on the weights as stored (rounded to save_dtype), loaded back in fp32.
    sizes = {}
    for name, model in models.items():
        sizes[name] = export(model, out / name, getattr(torch, args.save_dtype))
        from safetensors.torch import load_file
        model.load_state_dict({k: v.float() for k, v in load_file(str(out / name / "model.safetensors")).items()})
    tok.save(out / "tokenizer.json")
    for name, model in models.items():
        vl = heldout_loss(model, val_windows, 16, args.device)
        results[name].update(heldout_loss=round(vl, 5), heldout_ppl=round(math.exp(vl), 4),
                             parameters=model.num_parameters(), config=model.config.to_dict(),
                             safetensors_bytes=sizes[name])
        log(f"[{name}] stored weights: heldout loss {vl:.4f} ppl {math.exp(vl):.3f}")
    ev = greedy_alpha(models["target"], models["draft"], heldout_stream, args.alpha_prompts, 64, 32, args.device)
    log(f"alpha: {ev}")
    corpus_public = {k: v for k, v in corpus.items()}
    record = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.machine()} {platform.processor() or ''} {args.device}".strip(),
        "torch_version": torch.__version__,
        "args": vars(args),
        "corpus": corpus_public,
        "tokenizer": {"vocab_size": tok.vocab_size, "eot_id": tok.eot_id, "type": "byte-level BPE"},
        "tokens": {"train": len(train_stream), "heldout": len(heldout_stream)},
        "heldout_eval": {"windows": len(val_windows), "ctx": args.ctx,
                         "rule": "evenly spaced windows of ctx+1 tokens over the held-out stream"},
        "models": results,
        "eval": ev,
        "total_minutes": round((time.time() - t0) / 60, 2),
    }
    (out / "TRAINING.json").write_text(json.dumps(record, indent=1) + "\n")
    write_markdown(record, out / "TRAINING.md")
    log(f"wrote assets to {out} ({sum(sizes.values()) / 1e6:.1f} MB of weights); total {record['total_minutes']} min")


if __name__ == "__main__":
    main()
