"""Train the feature drafts' heads (Medusa, EAGLE-1, EAGLE without the token, EAGLE-3, MTP) on the frozen bundled target.

    python tools/training/train_heads.py --minutes 45                 # train, evaluate, write specref/assets/heads
    python tools/training/train_heads.py --minutes 1.5 --out .train_heads/smoke --eval-windows 8   # a smoke run
    python tools/training/train_heads.py --record-only                # rewrite TRAINING.md's section from heads.json

One process trains all five head sets: each step draws ``--batch-size`` windows of
``--ctx`` tokens from the pair's training stream (the same corpus and held-out split as
``tools/training/train_pair.py``, whose functions this reuses), runs the frozen target once with
``return_hidden=True``, and every head set learns from that one pass.  The inputs and
labels of every set are built by the teacher-forced helpers of ``heads_alignment`` (tools/training),
which the drafts' inference mirrors.  Labels are the frozen target's own next-token
distributions (cross-entropy against them: self-distillation), on a random subset of
``--ce-rows`` rows per loss term, because the 4096 x 128 LM head dominates a step.

Schedule: AdamW, linear warm-up then cosine decay over the wall-clock budget (as the
pair).  Every ``--ckpt-every-min`` minutes all heads are written (float16 safetensors) to
``--out``, so a stopped run leaves usable heads; at the end a held-out evaluation measures
teacher-forced greedy acceptance by draft position, and ``heads.json`` and a section of
``specref/assets/TRAINING.md`` record it with the hyper-parameters and loss curves.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools" / "training"))

from heads_alignment import eagle_inputs, eagle_unroll, medusa_inputs, mtp_unroll  # noqa: E402
from train_pair import collect_corpus, encode_stream, eval_windows, lr_at, open_log  # noqa: E402

from specref.drafts.heads import (  # noqa: E402
    EagleLayer,
    HeadsConfig,
    MedusaHeads,
    MTPStack,
    save_heads,
    target_fingerprint,
)
from specref.models.gpt2 import GPT2  # noqa: E402
from specref.models.pair import bundled_tokenizer, load_pair, training_record  # noqa: E402

SECTION_BEGIN = "<!-- heads: begin (written by tools/training/train_heads.py) -->"
SECTION_END = "<!-- heads: end -->"


# -- data ------------------------------------------------------------------------------------
def token_streams(work: Path, log) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The pair's train / held-out streams under the bundled tokenizer (cached in ``work``)."""
    path = work / "tokens.pt"
    expected = training_record()["corpus"]["file_list_sha256"]
    if path.exists():
        blob = torch.load(path)
        if blob.get("key") == expected:
            log("tokens: reused the cached streams")
            return blob["train"], blob["heldout"], blob["corpus"]
    train, heldout, info = collect_corpus(True, 400_000, 2.0)  # the pair's corpus arguments
    if info["file_list_sha256"] != expected:
        log(f"WARNING: this Python's stdlib differs from the pair's corpus ({info['file_list_sha256']} != {expected})")
    tok = bundled_tokenizer()
    blob = {"key": info["file_list_sha256"], "train": encode_stream(tok, train),
            "heldout": encode_stream(tok, heldout), "corpus": info}
    torch.save(blob, path)
    return blob["train"], blob["heldout"], info


# -- the head sets ---------------------------------------------------------------------------
def make_sets(target: GPT2, args) -> dict[str, tuple[torch.nn.Module, HeadsConfig]]:
    c = target.config
    top = c.n_layer
    fused = tuple(int(x) for x in args.eagle3_layers.split(","))
    common = dict(n_embd=c.n_embd, target_vocab_size=c.vocab_size, target_n_layer=c.n_layer,
                  target_fingerprint=target_fingerprint(target))
    specs = {
        "medusa": HeadsConfig(kind="medusa", name="medusa", n_heads=args.medusa_heads, **common),
        "eagle1": HeadsConfig(kind="eagle", name="eagle1", n_head=c.n_head, feature_layers=(top,),
                              use_token=True, **common),
        "eagle_notoken": HeadsConfig(kind="eagle", name="eagle_notoken", n_head=c.n_head, feature_layers=(top,),
                                     use_token=False, **common),
        "eagle3": HeadsConfig(kind="eagle", name="eagle3", n_head=c.n_head, feature_layers=fused,
                              use_token=True, ttt_steps=args.ttt_steps, **common),
        "mtp": HeadsConfig(kind="mtp", name="mtp", n_head=c.n_head, n_heads=args.mtp_depth, **common),
    }
    torch.manual_seed(args.seed)  # init only; batches use their own generator
    sets = {}
    for name, cfg in specs.items():
        if cfg.kind == "medusa":
            m = MedusaHeads(cfg.n_embd, cfg.n_heads)
        elif cfg.kind == "eagle":
            m = EagleLayer(cfg.n_embd, cfg.n_head, cfg.feature_layers, cfg.use_token)
        else:
            m = MTPStack(cfg.n_embd, cfg.n_head, cfg.n_heads)
            with torch.no_grad():  # start each module's final norm as the target's ln_f, the norm its head expects
                for mod in m.modules_list:
                    mod.norm_out.load_state_dict(target.transformer.ln_f.state_dict())
        if cfg.kind == "eagle":
            with torch.no_grad():  # the output norm starts as the target's ln_f, whose output it regresses
                m.norm_out.load_state_dict(target.transformer.ln_f.state_dict())
        if args.warm_start and cfg.kind != "medusa":
            warm_start(m, target)
        sets[name] = (m, cfg)
    return sets


@torch.no_grad()
def warm_start(m: torch.nn.Module, target: GPT2) -> None:
    """Start every block as a copy of the target's last block, and its output norm as the target's ln_f.

    The EAGLE layer's fc starts as [small random | identity]: x starts close to the next token's embedding
    plus its position, the input a GPT-2 block sees for that token, with a little of the feature mixed in.
    """
    blocks = [m.block] if isinstance(m, EagleLayer) else [mod.block for mod in m.modules_list]
    for b in blocks:
        b.load_state_dict(target.transformer.h[-1].state_dict())
    if isinstance(m, EagleLayer):
        m.norm_out.load_state_dict(target.transformer.ln_f.state_dict())
        if m.use_token:
            C = m.n_embd
            torch.nn.init.normal_(m.fc.weight[:, :C], 0.0, 0.02)
            m.fc.weight[:, C:] = torch.eye(C)
            m.fc.bias.zero_()


def _rows(B: int, lo: int, hi: int, n: int, gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """n random (batch, row) pairs with rows in [lo, hi); all of them when n <= 0 or n covers them."""
    if n <= 0 or n >= B * (hi - lo):
        b, r = torch.meshgrid(torch.arange(B), torch.arange(lo, hi), indexing="ij")
        return b.flatten(), r.flatten()
    return torch.randint(0, B, (n,), generator=gen), torch.randint(lo, hi, (n,), generator=gen)


def soft_ce(feats: torch.Tensor, label_logp: torch.Tensor, lm_head) -> torch.Tensor:  # [N, C], [N, V] -> []
    """Cross-entropy of lm_head(feats) against the target's distribution exp(label_logp)."""
    return F.cross_entropy(lm_head(feats), label_logp.exp())


def set_losses(sets, target: GPT2, hs, ids, target_logp, args, gen, noise_gen) -> dict[str, dict[str, torch.Tensor]]:
    """Every set's loss terms on one frozen target pass; each term is named, the set's total is 'loss'."""
    B, T = ids.shape
    lm = target.lm_head
    out: dict[str, dict[str, torch.Tensor]] = {}
    n = args.ce_rows

    def ce(feat_bt: torch.Tensor, lo: int, hi: int, offset: int, head=None) -> torch.Tensor:
        # feat_bt [B, L, C] rows r in [lo, hi) predict the token whose label is the target's logp at r + offset
        b, r = _rows(B, lo, hi, n, gen)
        f = feat_bt[b, r]
        if head is not None:
            f = head(f)
        return soft_ce(f, target_logp[b, r + offset], lm)

    # Medusa: head i at row t -> label at t+1+i
    med, cfg = sets["medusa"]
    mb = medusa_inputs(hs, cfg.n_heads)
    z = med(mb.h)  # [B, T, n, C]
    terms = {f"ce{i + 1}": ce(z[:, :, i], 0, T - 1 - i, 1 + i) for i in range(cfg.n_heads)}
    terms["loss"] = torch.stack(list(terms.values())).mean()
    out["medusa"] = terms

    # EAGLE-1 and the no-token ablation: feature regression (smooth L1) + w * token CE, on noisy features
    for name in ("eagle1", "eagle_notoken"):
        layer, cfg = sets[name]
        eb = eagle_inputs(layer, hs, ids, target)
        if args.feature_noise > 0:
            noise = (torch.rand(eb.g.shape, generator=noise_gen) * 2 - 1) * args.feature_noise
            eb = eb._replace(g=eb.g + noise)
        f_hat = eagle_unroll(layer, eb, 1)[0]  # [B, L, C]
        reg = F.smooth_l1_loss(f_hat, eb.next_feature)
        tce = ce(f_hat, 0, T - 1, 1)
        out[name] = {"reg": reg, "ce1": tce, "loss": reg + args.eagle_ce_weight * tce}

    # EAGLE-3: fused features, training-time test over ttt_steps, token CE per step
    layer, cfg = sets["eagle3"]
    eb = eagle_inputs(layer, hs, ids, target)
    steps = eagle_unroll(layer, eb, cfg.ttt_steps)
    terms = {f"ce{j}": ce(o, j - 1, T - 1, 1) for j, o in enumerate(steps, 1)}
    terms["loss"] = torch.stack(list(terms.values())).mean()
    out["eagle3"] = terms

    # MTP: depth d at row i -> label at i+d
    stack, cfg = sets["mtp"]
    hd = mtp_unroll(stack, hs, ids, target)
    terms = {f"ce{d}": ce(h, 0, T - d, d, stack[d - 1].norm_out) for d, h in enumerate(hd, 1)}
    terms["loss"] = torch.stack(list(terms.values())).mean()
    out["mtp"] = terms
    return out


# -- evaluation ------------------------------------------------------------------------------
@torch.no_grad()
def predictions(sets, target: GPT2, seqs: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
    """For each set given, argmax predictions ``pred[b, t, j-1]`` of draft position j from start t (token t+1+j).

    Start t is the last position the target scored; draft position j predicts x_{t+1+j}, whose
    target argmax sits at position t+j. Entries that do not exist are -1. ``sets`` may hold any
    subset of the five head sets; only those are run.
    """
    out = target(seqs, return_hidden=True)
    hs = out.hidden_states
    B, T = seqs.shape
    lm = target.lm_head
    preds = {}
    if "medusa" in sets:
        med, cfg = sets["medusa"]
        kk = min(k, cfg.n_heads)
        p = torch.full((B, T, kk), -1, dtype=torch.long)
        logits = med.logits(hs[-1], lm)  # [B, T, n, V]
        p[:, :, :kk] = logits[:, :, :kk].argmax(-1)
        preds["medusa"] = p
    for name in ("eagle1", "eagle_notoken", "eagle3"):
        if name not in sets:
            continue
        layer, cfg = sets[name]
        eb = eagle_inputs(layer, hs, seqs, target)
        steps = eagle_unroll(layer, eb, k)
        p = torch.full((B, T, k), -1, dtype=torch.long)
        for j, o in enumerate(steps, 1):  # step j row s = start t = s - j + 1
            a = lm(o).argmax(-1)  # [B, L]
            p[:, : T - 1 - (j - 1), j - 1] = a[:, j - 1:]
        preds[name] = p
    if "mtp" in sets:
        stack, cfg = sets["mtp"]
        kk = min(k, stack.depth)
        p = torch.full((B, T, kk), -1, dtype=torch.long)
        for d, h in enumerate(mtp_unroll(stack, hs, seqs, target)[:kk], 1):
            p[:, : T - d, d - 1] = stack[d - 1].logits(h, lm).argmax(-1)
        preds["mtp"] = p
    return preds


@torch.no_grad()
def acceptance(sets, target: GPT2, seqs: torch.Tensor, k: int, first_start: int = 0) -> dict[str, dict]:
    """Teacher-forced greedy acceptance by draft position along ``seqs`` [N, T], from starts t >= first_start.

    ``by_position[j-1]``: fraction of starts where position j's argmax equals the target's argmax
    for that token.  ``run[j-1]``: fraction where positions 1..j all do (on the target's own greedy
    text this is exactly greedy chain acceptance); ``tokens_per_pass_k`` = 1 + sum of ``run`` up to k.
    """
    chunks = [(target(c).argmax(-1), predictions(sets, target, c, k)) for c in seqs.split(4)]  # bounded memory
    t_arg = torch.cat([c[0] for c in chunks])  # [N, T]: the target's argmax for token u+1 at position u
    preds = {n: torch.cat([c[1][n] for c in chunks]) for n in chunks[0][1]}
    N, T = seqs.shape
    res = {}
    for name, p in preds.items():
        kk = p.shape[2]
        by, run, ok_all = [], [], None
        starts = torch.arange(first_start, T - kk)  # starts whose positions 1..kk all have a target argmax
        for j in range(1, kk + 1):
            pj = p[:, starts, j - 1]
            ok = pj == t_arg[:, starts + j]
            by.append(round(ok.float().mean().item(), 4))
            ok_all = ok if ok_all is None else ok_all & ok
            run.append(round(ok_all.float().mean().item(), 4))
        res[name] = {"by_position": by, "run": run, "tokens_per_pass": round(1 + sum(run), 3),
                     "starts": int(N * len(starts))}
    return res


@torch.no_grad()
def greedy_sequences(target: GPT2, prompts: torch.Tensor, gen_len: int) -> torch.Tensor:
    """prompts [N, P] followed by the target's greedy continuation of gen_len tokens: [N, P + gen_len]."""
    cache = target.new_cache(len(prompts), max_len=prompts.shape[1] + gen_len)
    logits = target(prompts, cache=cache)
    seq = [logits[:, -1].argmax(-1)]
    for _ in range(gen_len - 1):
        seq.append(target(seq[-1][:, None], cache=cache)[:, -1].argmax(-1))
    return torch.cat([prompts, torch.stack(seq, 1)], 1)


@torch.no_grad()
def draft_model_position1(draft: GPT2, target: GPT2, seqs: torch.Tensor, first_start: int) -> float:
    """The separate draft model's agreement with the target's argmax along the same sequences (position 1)."""
    d, t = draft(seqs).argmax(-1), target(seqs).argmax(-1)
    return round((d[:, first_start + 1:] == t[:, first_start + 1:]).float().mean().item(), 4)


# -- saving and the record -------------------------------------------------------------------
def save_all(sets, out: Path, minutes_trained: float, step: int, phases: list | None = None) -> dict[str, int]:
    """Every set to ``out/<name>.safetensors`` (float16); minutes and steps count earlier phases too."""
    sizes = {}
    for name, (m, cfg) in sets.items():
        cfg.notes = {"minutes_trained": round(minutes_trained, 2), "steps": step,
                     "parameters": sum(p.numel() for p in m.parameters()), **({"phases": phases} if phases else {})}
        sizes[name] = save_heads(m, cfg, out / f"{name}.safetensors")
    return sizes


def _fmt_list(xs) -> str:
    return " / ".join(f"{x:.3f}" for x in xs)


def write_markdown(record: dict, path: Path) -> None:
    """Put the heads' section into TRAINING.md between its markers (appended the first time)."""
    a, ev = record["args"], record["eval"]
    lines = [
        SECTION_BEGIN,
        "",
        "# The feature drafts' heads (Medusa, EAGLE, MTP): how they were trained",
        "",
        "Generated by `tools/training/train_heads.py`; the full record is `heads/heads.json`, the weights "
        "`heads/<name>.safetensors` (float16, loaded with `specref.drafts.heads.load_bundled_heads`).",
        "",
        f"- Frozen target: the bundled 12 x 128 GPT-2 above (fingerprint `{record['target_fingerprint']}`); "
        "the same corpus and held-out split as the pair (the training stream only; held-out files never "
        "seen).",
        f"- One process, one frozen target pass per step shared by all five head sets: batch {a['batch_size']} "
        f"windows x {a['ctx']} tokens, AdamW (lr {a['lr']}, betas 0.9/0.95, weight decay {a['weight_decay']}), "
        f"linear warm-up ({a['warmup_frac']:.0%} of the budget) then cosine to {a['min_lr_ratio']} x lr over a "
        f"wall-clock budget of {a['minutes']} min, grad-norm clip {a['grad_clip']} per set, seed {a['seed']}, "
        f"{a['threads']} thread(s) on `{record['machine']}`.",
        f"- Trained **{record['minutes_trained']} minutes**, {record['steps']} steps, "
        f"{record['tokens_seen']:,} target positions"
        + (f", in {len(record['phases'])} phases ("
           + "; ".join(f"{ph['minutes']} min, {ph['steps']} steps" + (f", lr {ph['lr']}" if ph.get("lr") else "")
                       for ph in record["phases"])
           + "), each resuming from the stored heads with a fresh optimizer and schedule."
           if len(record.get("phases") or []) > 1 else "."),
        f"- Labels: the frozen target's own next-token distribution (soft cross-entropy), on {a['ce_rows']} "
        "random rows per loss term per step (the 4096 x 128 LM head dominates a step).",
        "",
        f"| set | what | parameters | file bytes | training loss (last {a['log_every']} steps) |",
        "|---|---|---|---|---|",
    ]
    for name, s in record["sets"].items():
        lines.append(f"| `{name}` | {s['what']} | {s['parameters']:,} | {s['bytes']:,} | {s['loss']} |")
    lines += [
        "",
        f"All heads together: {record['total_bytes']:,} bytes (limit 4 MB).",
        "",
        f"Held-out evaluation, teacher forced (greedy: a draft position counts when the head's argmax equals "
        f"the target's argmax for the same token). Two sequence sets: (a) {ev['text']['windows']} evenly "
        f"spaced held-out text windows of {ev['text']['ctx']} tokens; (b) the target's own greedy "
        f"continuation ({ev['greedy']['gen_len']} tokens) of {ev['greedy']['prompts']} held-out prompts of "
        f"{ev['greedy']['prompt_len']} tokens, counting starts inside the continuation. On (b) the column "
        "'all of 1..j' is exactly greedy chain acceptance through position j, and 1 + its sum is the tokens per "
        "target pass of a greedy chain of that many drafts.",
        "",
        "| set | (a) text: acceptance at position 1 / 2 / ... | (b) greedy: at position 1 / 2 / ... | "
        "(b) all of 1..j | (b) tokens per pass |",
        "|---|---|---|---|---|",
    ]
    for name in record["sets"]:
        ta, ga = ev["text"]["sets"][name], ev["greedy"]["sets"][name]
        lines.append(f"| `{name}` | {_fmt_list(ta['by_position'])} | {_fmt_list(ga['by_position'])} | "
                     f"{_fmt_list(ga['run'])} | {ga['tokens_per_pass']} |")
    lines += [
        f"| separate draft model (reference) | {ev['text']['draft_model_position1']:.3f} | "
        f"{ev['greedy']['draft_model_position1']:.3f} | | |",
        "",
        f"EAGLE-1's greedy position-1 acceptance is {ev['greedy']['sets']['eagle1']['by_position'][0]:.3f} "
        f"against the benchmark's goal of 0.85 ({'met' if ev['greedy']['sets']['eagle1']['by_position'][0] >= 0.85 else 'NOT met'} "
        f"in this teacher-forced measurement), next to the separate draft model's "
        f"{ev['greedy']['draft_model_position1']:.3f}; the ablation without the next token reaches "
        f"{ev['greedy']['sets']['eagle_notoken']['by_position'][0]:.3f}.",
        "",
        "Loss curves at each checkpoint (training loss: the mean over the last "
        f"{a['log_every']} steps; held-out position-1 acceptance along 6 text windows; every "
        f"{a['log_every']} steps in `heads.json`):",
        "",
        "| minute | step | " + " | ".join(record["sets"]) + " | held-out position 1 (" +
        ", ".join(record["sets"]) + ") |",
        "|---|---|" + "---|" * len(record["sets"]) + "---|",
    ]
    for h in [h for h in record["history"] if h.get("heldout_pos1")]:
        lines.append(f"| {h['minutes']:.1f} | {h['step']} | " + " | ".join(f"{h['train'][n]:.3f}" for n in record["sets"])
                     + " | " + (" / ".join(f"{h['heldout_pos1'][n]:.3f}" for n in record["sets"])
                                if h.get("heldout_pos1") else "") + " |")
    lines += [
        "",
        "What each set follows, and what is simplified:",
        "",
        "- Medusa-1: 5 heads, a residual block `f + SiLU(W f + b)` each (W starts at 0), CE per head. "
        "Simplified: the heads share the target's frozen LM head instead of one LM head each; labels are the "
        "target's distributions (Medusa's self-distillation) rather than the text.",
        "- EAGLE-1 (`eagle1`): one GPT-2 block on `fc([f_t ; wte(x_{t+1})]) + wpe(t+1)`, predicting "
        f"`f_{{t+1}}`: smooth-L1 feature regression + {a['eagle_ce_weight']} x token CE, uniform feature noise "
        f"U(-{a['feature_noise']}, {a['feature_noise']}) on the input features, as the paper. Simplified: "
        "GPT-2's absolute positions (the target's frozen wpe) instead of rotary ones inside the block; the "
        "token CE is against the target's distribution at t+1, as the paper's p_{t+2}.",
        "- EAGLE without the token one step ahead (`eagle_notoken`): the same recipe with `fc(f_t)` only: the "
        "ablation notebook 05 measures.",
        f"- EAGLE-3 (`eagle3`): fused hidden states {record['sets']['eagle3']['feature_layers']} through "
        f"Linear(3C -> C), training-time test over {a['ttt_steps']} steps (each step reads the previous step's "
        "own outputs with the attention pattern a drafting KV cache gives), token CE per step, no feature "
        "regression. Simplified: the fed-back outputs are detached (computed without gradient); a small model "
        "(the paper scales data, we do not).",
        f"- MTP (`mtp`): {record['sets']['mtp']['depth']} DeepSeek-V3 modules chained by depth, "
        "`Block(M [RMSNorm(h^{d-1}) ; RMSNorm(wte(x_{i+d}))] + wpe(i+d))`, own final LayerNorm, the target's "
        "frozen LM head, CE per depth (mean over depths). DeepSeek trains MTP *during pre-training*, jointly "
        "with the main model (and its loss shapes the main model's representations); here the modules are "
        "trained post hoc on a frozen target, so only the modules adapt.",
        "- All sets: a wall-clock budget on a shared 2-core CPU, so far fewer tokens than the papers; the "
        "held-out numbers above are what the shipped weights (rounded to float16) give. The seed fixes the "
        "initialisation and the batches, but the step count follows the machine's load (the schedule is in "
        "elapsed time), so a rerun reproduces the heads only approximately. "
        "`python tools/training/train_heads.py --resume --minutes N` continues from the shipped heads.",
        "",
        SECTION_END,
    ]
    text = path.read_text() if path.exists() else ""
    section = "\n".join(lines)
    if SECTION_BEGIN in text and SECTION_END in text:
        text = re.sub(re.escape(SECTION_BEGIN) + ".*?" + re.escape(SECTION_END), lambda _: section, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")


WHAT = {
    "medusa": "Medusa-1 heads on the top feature",
    "eagle1": "EAGLE-1 layer: top feature + next token",
    "eagle_notoken": "EAGLE layer without the next token (ablation)",
    "eagle3": "EAGLE-3 layer: fused low/mid/top features, training-time test",
    "mtp": "DeepSeek-V3 MTP modules",
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "specref" / "assets" / "heads"))
    p.add_argument("--work", default=str(ROOT / ".train_heads"))
    p.add_argument("--training-md", default=str(ROOT / "specref" / "assets" / "TRAINING.md"))
    p.add_argument("--minutes", type=float, default=45.0, help="wall-clock budget of the training loop")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--ce-rows", type=int, default=128, help="rows per CE term per step (<= 0: all rows)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--warmup-frac", type=float, default=0.04)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--medusa-heads", type=int, default=5)
    p.add_argument("--mtp-depth", type=int, default=3)
    p.add_argument("--eagle3-layers", default="2,6,12")
    p.add_argument("--ttt-steps", type=int, default=3)
    p.add_argument("--eagle-ce-weight", type=float, default=0.1)
    p.add_argument("--feature-noise", type=float, default=0.1)
    p.add_argument("--warm-start", type=int, default=0,
                   help="1: blocks start as the target's last block (a 2-minute smoke run learned slower with it)")
    p.add_argument("--ckpt-every-min", type=float, default=5.0)
    p.add_argument("--log-every", type=int, default=20, help="steps per loss-curve point in the log")
    p.add_argument("--eval-windows", type=int, default=48, help="held-out text windows of the final evaluation")
    p.add_argument("--eval-prompts", type=int, default=32)
    p.add_argument("--eval-k", type=int, default=5)
    p.add_argument("--resume", action="store_true",
                   help="start from the heads in --out (a new phase: fresh optimizer and schedule)")
    p.add_argument("--record-only", action="store_true", help="only rewrite TRAINING.md's section from heads.json")
    return p.parse_args()


def resume_heads(sets, out: Path, log) -> dict:
    """Load the heads stored in `out` into `sets` (a new phase: fresh optimizer and schedule); returns what they record."""
    from specref.drafts.heads import load_heads

    prior = {"minutes": 0.0, "steps": 0, "phases": []}
    for name, (m, _cfg) in sets.items():
        loaded, old = load_heads(out / f"{name}.safetensors")
        m.load_state_dict(loaded.state_dict())
        minutes, steps = old.notes.get("minutes_trained", 0.0), old.notes.get("steps", 0)
        prior = {"minutes": minutes, "steps": steps,  # a first run's heads carry no phase list: one phase
                 "phases": old.notes.get("phases") or [{"minutes": minutes, "steps": steps, "lr": None}]}
    log(f"resumed from {out}: {prior['steps']} steps, {prior['minutes']} min")
    return prior


def make_optimizer(sets, args) -> torch.optim.AdamW:
    """AdamW over every set's parameters, weight decay on matrices only."""
    groups = []
    for m, _ in sets.values():
        m.train()
        decay = [q for q in m.parameters() if q.ndim >= 2]
        no_decay = [q for q in m.parameters() if q.ndim < 2]
        groups += [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def final_evaluation(sets, target: GPT2, draft: GPT2, heldout_stream: torch.Tensor, args, out: Path, log):
    """The heads as stored (float16), loaded back in float32, on held-out text and on the target's greedy output.

    Returns (the loaded sets, the evaluation record).
    """
    from specref.drafts.heads import load_heads

    sets = {n: (load_heads(out / f"{n}.safetensors")[0], cfg) for n, (_, cfg) in sets.items()}
    text = eval_windows(heldout_stream, args.ctx - 1, args.eval_windows)  # [n, ctx]
    ev_text = acceptance(sets, target, text, args.eval_k)
    P, G = 64, 96
    prompts = eval_windows(heldout_stream, P - 1, args.eval_prompts)  # [n, P], other windows than heldout_prompts
    seqs = greedy_sequences(target, prompts, G)
    ev_greedy = acceptance(sets, target, seqs, args.eval_k, first_start=P - 1)
    ev = {"text": {"windows": len(text), "ctx": text.shape[1], "sets": ev_text,
                   "draft_model_position1": draft_model_position1(draft, target, text, 0)},
          "greedy": {"prompts": len(prompts), "prompt_len": P, "gen_len": G, "sets": ev_greedy,
                     "draft_model_position1": draft_model_position1(draft, target, seqs, P - 1)}}
    for n in sets:
        log(f"[{n}] text by position {ev_text[n]['by_position']} | greedy by position "
            f"{ev_greedy[n]['by_position']} run {ev_greedy[n]['run']} tokens/pass {ev_greedy[n]['tokens_per_pass']}")
    log(f"draft model position 1: text {ev['text']['draft_model_position1']} greedy {ev['greedy']['draft_model_position1']}")
    return sets, ev


def main() -> None:
    args = parse_args()
    out, work = Path(args.out), Path(args.work)
    if args.record_only:
        write_markdown(json.loads((out / "heads.json").read_text()), Path(args.training_md))
        return
    torch.set_num_threads(args.threads)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    log = open_log(work)
    log(f"args: {vars(args)}")
    t0 = time.time()
    target, draft, _ = load_pair()
    target.requires_grad_(False).eval()
    train_stream, heldout_stream, corpus = token_streams(work, log)
    log(f"tokens: train {len(train_stream)} heldout {len(heldout_stream)}; setup {time.time() - t0:.0f}s")
    sets = make_sets(target, args)
    prior = resume_heads(sets, out, log) if args.resume else {"minutes": 0.0, "steps": 0, "phases": []}
    for name, (m, _) in sets.items():
        log(f"[{name}] {sum(q.numel() for q in m.parameters()):,} parameters")

    opt = make_optimizer(sets, args)
    gen = torch.Generator().manual_seed(args.seed)
    noise_gen = torch.Generator().manual_seed(args.seed + 1)
    quick_windows = eval_windows(heldout_stream, args.ctx - 1, 6)  # [6, ctx] for the curve

    budget = args.minutes * 60.0
    start = time.time()
    next_ckpt = start + args.ckpt_every_min * 60
    step, history, acc = 0, [], {n: [] for n in sets}
    B, T = args.batch_size, args.ctx
    bar = tqdm(total=int(budget), desc="heads", unit="s", mininterval=15, file=sys.stdout)

    def curve_point(with_eval: bool) -> None:
        point = {"minutes": round((time.time() - start) / 60, 2), "step": step,
                 "train": {n: round(sum(v) / max(len(v), 1), 4) for n, v in acc.items()}}
        if with_eval:
            for m, _ in sets.values():
                m.eval()
            qa = acceptance(sets, target, quick_windows, 1)
            for m, _ in sets.values():
                m.train()
            point["heldout_pos1"] = {n: r["by_position"][0] for n, r in qa.items()}
        history.append(point)
        for v in acc.values():
            v.clear()
        log(f"step {step} min {point['minutes']:.1f} train " + " ".join(f"{n}={v:.3f}" for n, v in point["train"].items())
            + ("" if not with_eval else " | heldout pos1 " + " ".join(f"{n}={v:.3f}" for n, v in point["heldout_pos1"].items())))

    while True:
        elapsed = time.time() - start
        if elapsed >= budget:
            break
        cur_lr = lr_at(elapsed / budget, args.lr, args.warmup_frac, args.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        starts = torch.randint(0, len(train_stream) - T, (B,), generator=gen)
        ids = torch.stack([train_stream[s:s + T] for s in starts.tolist()]).long()  # [B, T]
        with torch.no_grad():
            tout = target(ids, return_hidden=True)
            target_logp = F.log_softmax(tout.logits, -1)  # [B, T, V]
        losses = set_losses(sets, target, tout.hidden_states, ids, target_logp, args, gen, noise_gen)
        total = sum(t["loss"] for t in losses.values())
        opt.zero_grad(set_to_none=True)
        total.backward()
        for m, _ in sets.values():
            torch.nn.utils.clip_grad_norm_(m.parameters(), args.grad_clip)
        opt.step()
        step += 1
        for n, t in losses.items():
            acc[n].append(t["loss"].item())
        bar.update(int(time.time() - start) - bar.n)
        if step % args.log_every == 0:
            bar.set_postfix(step=step, lr=f"{cur_lr:.2e}", **{n: f"{t['loss'].item():.3f}" for n, t in losses.items()})
            ckpt = time.time() >= next_ckpt
            curve_point(ckpt)
            if ckpt:
                sizes = save_all(sets, out, prior["minutes"] + (time.time() - start) / 60, prior["steps"] + step)
                log(f"checkpoint: {sum(sizes.values()):,} bytes written to {out}")
                next_ckpt = time.time() + args.ckpt_every_min * 60
    bar.close()
    minutes_phase = round((time.time() - start) / 60, 2)
    minutes_trained = round(prior["minutes"] + minutes_phase, 2)
    if any(acc.values()):
        curve_point(True)
    phases = prior["phases"] + [{"minutes": minutes_phase, "steps": step, "lr": args.lr}]
    step_total = prior["steps"] + step
    sizes = save_all(sets, out, minutes_trained, step_total, phases)
    total_bytes = sum(sizes.values())
    log(f"trained {minutes_trained} min, {step} steps; heads {total_bytes:,} bytes "
        f"({'within' if total_bytes <= 4_000_000 else 'OVER'} the 4 MB limit)")

    sets, ev = final_evaluation(sets, target, draft, heldout_stream, args, out, log)

    last = history[-1]["train"] if history else {}
    record = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.machine()} {platform.processor() or ''} cpu".strip(),
        "torch_version": torch.__version__,
        "args": vars(args),
        "target_fingerprint": target_fingerprint(target),
        "corpus_file_list_sha256": corpus["file_list_sha256"],
        "minutes_trained": minutes_trained,
        "steps": step_total,
        "phases": phases,
        "tokens_seen": step_total * B * T,
        "total_minutes": round((time.time() - t0) / 60, 2),
        "total_bytes": total_bytes,
        "sets": {n: {"what": WHAT[n], "config": cfg.to_dict(), "parameters": sum(q.numel() for q in m.parameters()),
                     "bytes": sizes[n], "loss": last.get(n),
                     **({"feature_layers": list(cfg.feature_layers)} if cfg.kind == "eagle" else {}),
                     **({"depth": cfg.n_heads} if cfg.kind == "mtp" else {})}
                 for n, (m, cfg) in sets.items()},
        "history": history,
        "eval": ev,
    }
    (out / "heads.json").write_text(json.dumps(record, indent=1) + "\n")
    write_markdown(record, Path(args.training_md))
    log(f"wrote {out / 'heads.json'} and {args.training_md}; total {record['total_minutes']} min")


if __name__ == "__main__":
    main()
