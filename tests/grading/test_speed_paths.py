"""What grading repeats for every submission, made cheaper without changing what it computes.

* A GPT2 built on the meta device (the bundled pair and the grown target as they load, ex01's GPT-2 XL shape) skips
  its random initialisers there (specref.models.meta_init.NoMetaDraws): a fresh process (each grading's trusted process
  and kernel) no longer imports torch._dynamo for meta's normal_; on the CPU the draws are the same as without it,
  and a loaded model is the checkpoint's, tensor for tensor.
* ex04's float64 reference (checks.gpt2_pair._target_greedy) is run once per prompt and length in a trusted
  process, whatever the k it is compared at: the same tokens and margin as a fresh run, and a fresh list each call
  (what one check does to it cannot reach the next).
"""

from __future__ import annotations

import subprocess
import sys

import torch
from safetensors.torch import load_file

from specref.models import heldout_prompts, load_pair
from specref.models.pair import assets_dir

LOADS = """
import sys
import torch
{build}
print("torch._dynamo" in sys.modules)
"""


def _imports_dynamo(build: str) -> bool:
    out = subprocess.run([sys.executable, "-I", "-c", LOADS.format(build=build)], capture_output=True, text=True,
                         timeout=300, check=True)
    return out.stdout.strip().splitlines()[-1] == "True"


def test_meta_builds_and_pair_loads_without_torch_compiler():
    assert not _imports_dynamo("from specref import load_pair, load_grown_pair\nload_pair()\nload_grown_pair()\n"
                               "from specref.models.gpt2 import GPT2, GPT2Config\nwith torch.device('meta'):\n"
                               "    GPT2(GPT2Config(n_layer=48, n_embd=1600, n_head=25))")


def test_meta_draw_without_the_mode_imports_torch_compiler():
    # Negative control: a module whose initialiser draws, built on the meta device outside GPT2, does import it.
    assert _imports_dynamo("with torch.device('meta'):\n    torch.nn.Embedding(10, 4)")


def test_cpu_draws_unchanged_by_the_mode():
    from specref.models.gpt2 import GPT2, GPT2Config
    from specref.models.meta_init import NoMetaDraws

    torch.manual_seed(5)
    plain = torch.nn.init.normal_(torch.empty(64), std=0.02)
    torch.manual_seed(5)
    with NoMetaDraws():
        moded = torch.nn.init.normal_(torch.empty(64), std=0.02)
    assert torch.equal(plain, moded)
    torch.manual_seed(5)
    model = GPT2(GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=64, n_positions=16))
    w = model.transformer.wte.weight
    assert 0.015 < float(w.detach().std()) < 0.025  # drawn with GPT-2's initializer_range, not skipped


def test_pair_is_the_checkpoint():
    target, draft, _ = load_pair()
    for model, folder in ((target, "target"), (draft, "draft")):
        saved = load_file(str(assets_dir() / folder / "model.safetensors"))
        mine = model.state_dict()
        assert not any(t.is_meta for t in mine.values())
        for name, t in saved.items():
            key = name if name in mine else f"transformer.{name}"
            assert torch.equal(mine[key], t.to(mine[key].dtype)), name


def test_target_greedy_run_once_per_prompt_fresh_lists():
    from specref_grading.checks import gpt2_pair as G

    G._target_greedy_run.cache_clear()
    prompts = heldout_prompts(n=2, n_tokens=12)
    first = G._target_greedy(prompts[0], 8)
    first[0].append(-1)  # a caller's change to its list
    again = G._target_greedy(prompts[0], 8)
    fresh = G._target_greedy_run.__wrapped__(tuple(prompts[0]), 8)
    assert again == (list(fresh[0]), fresh[1]) and -1 not in again[0]
    other = G._target_greedy(prompts[1], 8)
    assert other[0] == list(G._target_greedy_run.__wrapped__(tuple(prompts[1]), 8)[0])
    assert G._target_greedy_run.cache_info().misses == 2 and G._target_greedy_run.cache_info().hits == 1
    # The counts do not depend on the order the ks are asked in (the shared run is the target's alone).
    a = [G.greedy_count(prompts, k, 8) for k in (1, 3)]
    G._target_greedy_run.cache_clear()
    b = [G.greedy_count(prompts, k, 8) for k in (3, 1)][::-1]
    assert a == b
