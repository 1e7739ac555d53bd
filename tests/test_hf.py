"""The harness that runs Hugging Face's assisted generation beside specref (notebook 08, benchmarks/bench_hf.py).

The converted pair scores like ours; greedy output equals specref's token for token; at a constant k
both take the same steps and draft the same number of tokens; counting leaves the model as it was;
a missing knob is reported instead of crashing.
"""

from __future__ import annotations

import pytest
import torch

from specref import generate, load_pair
from specref.checks.hf_audit import first_departure
from specref.models.pair import heldout_prompts
from specref.perf import hf

transformers = pytest.importorskip("transformers")
N_NEW = 24


@pytest.fixture(scope="module")
def pair():
    target, draft, _ = load_pair(dtype=torch.float64)
    return target, draft, hf.to_hf(target), hf.to_hf(draft)


@pytest.fixture(scope="module")
def prompts():
    return heldout_prompts(n=2, n_tokens=32)


def test_the_installed_transformers_has_every_knob():
    assert hf.hf_missing() is None


def test_converted_model_scores_like_ours(pair, prompts):
    target, _, hf_target, _ = pair
    ids = torch.tensor(prompts)
    with torch.no_grad():
        torch.testing.assert_close(hf_target(ids).logits, target(ids), atol=1e-10, rtol=1e-10)
    assert hf_target.generation_config.eos_token_id is None  # the bundled EOS (token 0) does not stop HF


def test_constant_k_takes_specrefs_steps_and_writes_the_greedy_text(pair, prompts):
    target, draft, hf_target, hf_draft = pair
    for pr in prompts:
        greedy = generate(target, torch.tensor([pr]), N_NEW, temperature=0)[0, len(pr):]
        ours = hf.specref_generate(target, pr, N_NEW, draft=draft, k=4)
        theirs = hf.hf_generate(hf_target, pr, N_NEW, draft=hf_draft, k=4)
        assert torch.equal(ours.new_tokens, greedy) and torch.equal(theirs.new_tokens, greedy)
        assert ours.steps == theirs.steps and ours.drafted == theirs.drafted
        assert ours.target_passes == theirs.target_passes + 1  # specref's prefill pass
        assert ours.tokens_per_pass == N_NEW / ours.steps


def test_schedules_and_lookup_keep_the_greedy_text(pair, prompts):
    target, _, hf_target, hf_draft = pair
    pr = prompts[0]
    greedy = generate(target, torch.tensor([pr]), N_NEW, temperature=0)[0, len(pr):]
    heur = hf.hf_generate(hf_target, pr, N_NEW, draft=hf_draft, k=4, schedule="heuristic_transient")
    assert torch.equal(heur.new_tokens, greedy)
    # +2 after a step that accepted every draft, -1 (not below 1) after any other; the budget caps the last steps
    assert heur.drafted[0] == 4
    for d, nxt in zip(heur.drafted[:-2], heur.drafted[1:-1]):
        assert nxt in (d + 2, max(1, d - 1)), heur.drafted
    for lookup_run in (hf.hf_generate(hf_target, pr, N_NEW, lookup=True, k=4),
                       hf.specref_generate(target, pr, N_NEW, lookup=True, k=4)):
        assert torch.equal(lookup_run.new_tokens, greedy)
    assert hf_draft.generation_config.num_assistant_tokens_schedule != "heuristic_transient"  # restored


def test_ensemble_weight_moves_greedy_output(pair, prompts):
    target, _, hf_target, hf_draft = pair
    if "assistant_ensemble_weight" not in vars(transformers.GenerationConfig()):
        pytest.skip("this transformers has no assistant_ensemble_weight")
    moved = []
    for pr in heldout_prompts(n=4, n_tokens=32):
        greedy = generate(target, torch.tensor([pr]), 48, temperature=0)[0, len(pr):]
        run = hf.hf_generate(hf_target, pr, 48, draft=hf_draft, k=4, ensemble_weight=0.8)
        moved.append(first_departure(greedy, run.new_tokens))
    assert any(m is not None for m in moved)


def test_count_passes_counts_and_restores(pair):
    target = pair[0]
    forward = target.forward
    with hf.count_passes(target) as count, torch.no_grad():
        target(torch.tensor([[1, 2, 3]]))
        target(input_ids=torch.tensor([[4]]))
    assert (count.passes, count.tokens, count.sizes) == (2, 4, [3, 1])
    assert target.forward == forward and "forward" not in vars(target)


def test_bad_arguments_are_refused(pair, prompts):
    target, draft, hf_target, hf_draft = pair
    with pytest.raises(ValueError, match="exactly one"):
        hf.hf_generate(hf_target, prompts[0], 4)
    with pytest.raises(ValueError, match="exactly one"):
        hf.specref_generate(target, prompts[0], 4, draft=draft, lookup=True)
    with pytest.raises(ValueError, match="schedule"):
        hf.hf_generate(hf_target, prompts[0], 4, draft=hf_draft, schedule="sometimes")
    with pytest.raises(ValueError, match="k must be"):
        hf.hf_generate(hf_target, prompts[0], 4, draft=hf_draft, k=0)
    with pytest.raises(TypeError, match="specref GPT2"):
        hf.to_hf(hf_target)


def test_a_missing_knob_is_reported():
    class OldConfig:  # a generation config from before prompt lookup and the schedules
        num_assistant_tokens = 5

    missing = hf.hf_missing(OldConfig())
    assert missing is not None and "prompt_lookup_num_tokens" in missing and "num_assistant_tokens," not in missing
