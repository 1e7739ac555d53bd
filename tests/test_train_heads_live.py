"""Medusa heads trained live on the frozen bundled target: seeded, the loss falls, acceptance rises (counted).

The training text is the training side of the pair's split of this Python's standard library (held-out
files never read); training runs in float32, the counts in float64 on fixed held-out prompts.
"""

from __future__ import annotations

import json

import pytest
import torch

from specref.drafts import load_draft
from specref.drafts.train import MedusaTrainer, is_heldout, train_medusa, training_files, training_windows
from specref.models.pair import assets_dir, heldout_prompts, load_pair
from specref.perf.training_curve import AcceptanceCounts, acceptance_counts, training_curve


@pytest.fixture(scope="module")
def target32():
    return load_pair()[0]


@pytest.fixture(scope="module")
def target64():
    return load_pair(dtype=torch.float64)[0]


@pytest.fixture(scope="module")
def windows():
    return training_windows(24, 64, torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def prompts():
    return torch.tensor(heldout_prompts(4, 32))


def test_the_training_text_never_holds_a_held_out_file():
    files = training_files()
    held = {p["file"] for p in json.loads(assets_dir().joinpath("heldout_prompts.json").read_text())["prompts"]}
    assert held and all(is_heldout(f) for f in held)  # the split rule is the pair's own
    assert not any(path.as_posix().endswith("/" + f) for path in files for f in held)


def test_the_same_seed_gives_the_same_weights_and_another_seed_other_weights(target32, windows):
    def heads(seed: int) -> torch.Tensor:
        trainer = MedusaTrainer(target32, torch.Generator().manual_seed(seed), windows=windows)
        trainer.train(5)
        return torch.cat([p.detach().flatten() for p in trainer.heads.parameters()])

    assert torch.equal(heads(3), heads(3))
    assert not torch.equal(heads(3), heads(4))


def test_the_windows_come_from_the_generator_alone():
    state = torch.random.get_rng_state()
    a = training_windows(4, 32, torch.Generator().manual_seed(7))
    b = training_windows(4, 32, torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and a.shape == (4, 32)
    assert torch.equal(state, torch.random.get_rng_state()), "the global RNG was used"


def test_the_loss_falls(target32, windows):
    _, record = train_medusa(target32, 60, torch.Generator().manual_seed(0), windows=windows)
    assert record.steps == 60 and len(record.losses) == 60
    first, last = sum(record.losses[:10]) / 10, sum(record.losses[-10:]) / 10
    assert last < first - 0.2, (first, last)


def test_a_trainer_refuses_bad_arguments(target32, windows):
    with pytest.raises(TypeError, match="generator"):
        MedusaTrainer(target32, 0, windows=windows)
    with pytest.raises(ValueError, match="lr"):
        MedusaTrainer(target32, torch.Generator(), windows=windows, lr=0)
    with pytest.raises(ValueError, match="windows"):
        MedusaTrainer(target32, torch.Generator(), windows=windows[:, :3])
    with pytest.raises(ValueError, match="steps"):
        MedusaTrainer(target32, torch.Generator(), windows=windows).train(-1)


def test_counts_are_the_generations_own(target64, prompts):
    """Tokens per step sum to the tokens generated; position 1 is reached by every step that drafted (all but at
    most a last one per row, whose budget left no room for a draft)."""
    counts = acceptance_counts(target64, load_draft("medusa", target64), prompts, 3, 24)
    assert isinstance(counts, AcceptanceCounts)
    assert sum(counts.tokens_per_step) == prompts.shape[0] * 24
    steps = len(counts.tokens_per_step)
    assert steps - prompts.shape[0] <= counts.by_position[0][1] <= steps
    tau, lo, hi = counts.tau_interval()
    assert lo <= tau <= hi and tau == pytest.approx(counts.tau)


def test_acceptance_rises_with_training_steps(target32, target64, prompts, windows):
    """Counted in float64 on fixed held-out prompts: untrained heads, the same heads after 300 steps, the shipped set.

    Untrained, head i is the target's own next-token head, so it guesses x_{t+1} where x_{t+2+i} is
    wanted; trained, it guesses the token after. The shipped heads (trained far longer) accept more than
    untrained ones too.
    """
    points, trainer = training_curve(target32, (0, 300), torch.Generator().manual_seed(0), prompts, k=3,
                                     max_new_tokens=24, eval_target=target64, windows=training_windows(
                                         64, 128, torch.Generator().manual_seed(2)))
    start, trained = points
    assert start.steps == 0 and start.loss is None and trained.steps == trainer.record.steps == 300
    accepted = [sum(a for a, _ in p.counts.by_position) for p in points]
    assert accepted[1] > accepted[0]
    assert trained.counts.tau > start.counts.tau
    shipped = acceptance_counts(target64, load_draft("medusa", target64), prompts, 3, 24)
    assert sum(a for a, _ in shipped.by_position) > accepted[0]


def test_a_curve_needs_increasing_steps(target32, prompts, windows):
    with pytest.raises(ValueError, match="steps"):
        training_curve(target32, (10, 5), torch.Generator(), prompts, windows=windows)
    with pytest.raises(ValueError, match="k=4"):
        training_curve(target32, (0,), torch.Generator(), prompts, k=4, n_heads=3, windows=windows)
