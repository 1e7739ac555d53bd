"""The few-token CPU kernel: the product it computes, its row independence, when it serves, and its fallback."""

from __future__ import annotations

import copy
import pickle
import tempfile
from pathlib import Path

import pytest
import torch

from specref.models import kernels
from specref.models.gpt2 import GPT2, GPT2Config, use_small_kernel
from specref.models.kernels import MAX_ROWS, SmallLinear, kernel_path

compiled = pytest.mark.skipif(kernel_path().name != "compiled", reason="no C compiler here: " + kernel_path().reason)


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def error_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # [M, N]
    """Float32 summation error bound for x @ w: K * eps * sum_k |x_k w_kn| (each partial sum rounds once)."""
    K = x.shape[1]
    return (K + 2) * torch.finfo(torch.float32).eps * (x.abs() @ w.abs()) + 1e-7


@compiled
@pytest.mark.parametrize("M, K, N", [(1, 64, 48), (5, 128, 96), (7, 96, 40), (13, 32, 16), (32, 512, 2048)])
def test_small_linear_computes_bias_plus_x_times_w_within_float32_rounding(M, K, N):
    x, w, b = rand(M, K, seed=1), rand(K, N, seed=2), rand(N, seed=3)
    got = SmallLinear(w, b)(x)
    ref = (b.double() + x.double() @ w.double()).float()
    assert got.shape == (M, N)
    assert bool(((got - ref).abs() <= error_bound(x, w)).all())


@compiled
def test_a_wrong_packing_fails_the_same_bound():
    """Negative control: the bound above is tight enough to catch a kernel that reads the wrong weights."""
    x, w, b = rand(3, 64, seed=1), rand(64, 32, seed=2), rand(32, seed=3)
    broken = SmallLinear(w, b)
    broken.packed = broken.packed.flip(0).contiguous()  # panels swapped
    ref = (b.double() + x.double() @ w.double()).float()
    assert not bool(((broken(x) - ref).abs() <= error_bound(x, w)).all())


@compiled
def test_a_rows_result_does_not_depend_on_how_many_rows_share_the_call():
    x, w, b = rand(MAX_ROWS, 256, seed=4), rand(256, 160, seed=5), rand(160, seed=6)
    lin = SmallLinear(w, b)
    alone = torch.cat([lin(x[i:i + 1]) for i in range(MAX_ROWS)])
    for m in (2, 3, 5, 6, 7, 12, MAX_ROWS):
        assert torch.equal(lin(x[:m]), alone[:m])


@compiled
def test_the_transposed_layout_is_the_lm_heads_product():
    x, w = rand(4, 64, seed=7), rand(300, 64, seed=8)  # nn.Linear's [out, in]
    got = SmallLinear(w, None, transposed=True)(x)
    assert torch.allclose(got, x @ w.t(), atol=1e-4)


@compiled
def test_small_linear_never_writes_its_inputs():
    x, w, b = rand(3, 32), rand(32, 16), rand(16)
    before = [t.clone() for t in (x, w, b)]
    SmallLinear(w, b)(x)
    assert all(torch.equal(a, t) for a, t in zip(before, (x, w, b)))


@compiled
@pytest.mark.parametrize("weight", [torch.zeros(4, 4, dtype=torch.float64), torch.zeros(4), torch.zeros(2, 2, 2)])
def test_small_linear_refuses_what_it_cannot_serve(weight):
    with pytest.raises(ValueError, match="weight must be a float32 CPU"):
        SmallLinear(weight, None)


def tiny_model(seed: int = 0) -> GPT2:
    torch.manual_seed(seed)  # the model's own init; the tests compare two passes of one model
    return GPT2(GPT2Config(vocab_size=97, n_positions=64, n_embd=48, n_layer=2, n_head=4)).eval()


@compiled
def test_use_small_kernel_gives_the_same_logits_and_serves_every_linear():
    model = tiny_model()
    ids = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids)
        path = use_small_kernel(model)
        got = model(ids)
    assert path.name == "compiled"
    served = [m for m in model.modules() if "fast" in m.__dict__]
    assert len(served) == 4 * 2 + 1  # four Conv1D per block, and the LM head
    assert torch.allclose(got, ref, atol=1e-5)


@compiled
def test_the_kernel_serves_only_passes_it_fits(monkeypatch):
    model = tiny_model()
    use_small_kernel(model)
    calls = []
    real = SmallLinear.__call__
    monkeypatch.setattr(SmallLinear, "__call__", lambda self, x: calls.append(x.shape[0]) or real(self, x))
    ids = torch.randint(0, 97, (1, MAX_ROWS + 1), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(ids[:, :3])
    assert calls and set(calls) == {3}
    calls.clear()
    with torch.no_grad():
        model(ids)  # more rows than MAX_ROWS: torch.addmm
    assert calls == []
    model(ids[:, :3])  # a pass that autograd records: torch's kernels, which have a backward
    assert calls == []


@compiled
def test_a_weight_changed_after_packing_is_not_served_stale():
    model = tiny_model()
    use_small_kernel(model)
    ids = torch.randint(0, 97, (1, 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight.mul_(2.0)  # an in-place write bumps the version
        got = model(ids)
        model.transformer.h[0].mlp.c_fc.__dict__.pop("fast")  # the same layer through torch only
    with torch.no_grad():
        ref = model(ids)
    assert torch.allclose(got, ref, atol=1e-5)


@compiled
def test_moving_or_reloading_the_model_drops_the_packed_copies():
    model = tiny_model()
    use_small_kernel(model)
    model.double()
    assert not any("fast" in m.__dict__ for m in model.modules())
    model.float()
    use_small_kernel(model)
    model.load_state_dict(tiny_model(seed=1).state_dict())
    assert not any("fast" in m.__dict__ for m in model.modules())


@compiled
def test_a_model_with_the_kernel_copies_and_pickles():
    model = tiny_model()
    use_small_kernel(model)
    ids = torch.randint(0, 97, (1, 4), generator=torch.Generator().manual_seed(2))
    twin, thawed = copy.deepcopy(model), pickle.loads(pickle.dumps(model))
    with torch.no_grad():
        assert torch.allclose(twin(ids), model(ids), atol=1e-6)
        assert torch.allclose(thawed(ids), model(ids), atol=1e-6)


def test_use_small_kernel_leaves_a_float64_model_on_torch():
    model = tiny_model().double()
    path = use_small_kernel(model)
    assert path.name == "torch" and not any("fast" in m.__dict__ for m in model.modules())


def test_use_small_kernel_refuses_what_is_not_a_gpt2():
    with pytest.raises(TypeError, match="model must be a GPT2"):
        use_small_kernel(torch.nn.Linear(3, 3))


def test_without_a_compiler_the_path_is_torch_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECREF_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler-here")
    kernels._library.cache_clear()
    try:
        path = kernel_path()
        assert path.name == "torch" and "no C compiler" in path.reason
        model = tiny_model()
        assert use_small_kernel(model).name == "torch"
        assert not any("fast" in m.__dict__ for m in model.modules())
    finally:
        kernels._library.cache_clear()


def test_specref_kernel_torch_forces_the_fallback(monkeypatch):
    monkeypatch.setenv("SPECREF_KERNEL", "torch")
    kernels._library.cache_clear()
    try:
        assert kernel_path() == kernels.KernelPath("torch", "SPECREF_KERNEL=torch")
    finally:
        kernels._library.cache_clear()


@compiled
def test_the_kernel_is_built_once_into_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECREF_CACHE", str(tmp_path))
    kernels._library.cache_clear()
    try:
        assert kernel_path().name == "compiled"
        built = list(tmp_path.glob("small_linear-*.so"))
        assert len(built) == 1
        stamp = built[0].stat().st_mtime_ns
        kernels._library.cache_clear()
        assert kernel_path().name == "compiled"
        assert built[0].stat().st_mtime_ns == stamp  # loaded from the cache, not rebuilt
    finally:
        kernels._library.cache_clear()


@compiled
def test_a_vocabulary_that_is_not_a_whole_number_of_panels_gives_whole_logits():
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=101, n_positions=32, n_embd=32, n_layer=1, n_head=2)).eval()
    ids = torch.randint(0, 101, (2, 3), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(ids)
        use_small_kernel(model)
        got = model(ids)
    assert got.shape == (2, 3, 101) and torch.allclose(got, ref, atol=1e-5)


@compiled
def test_a_default_device_context_does_not_move_the_kernels_output():
    """The output is made on the CPU whatever the default device (a meta default once meant a write through nothing)."""
    model = tiny_model()
    use_small_kernel(model)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        ref = model(ids)
        with torch.device("meta"):
            got = model(ids)
    assert got.device.type == "cpu" and torch.allclose(got, ref)


@compiled
@pytest.mark.parametrize("n_embd", [48, 40])  # 40: the Conv1D widths are not whole panels, the bias is padded
def test_a_bias_changed_after_packing_is_not_served_stale(n_embd):
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab_size=97, n_positions=32, n_embd=n_embd, n_layer=1, n_head=4)).eval()
    use_small_kernel(model)
    ids = torch.tensor([[5, 6, 7]])
    conv = model.transformer.h[0].mlp.c_fc
    with torch.no_grad():
        conv.bias.add_(1.0)
        got = model(ids)
        conv.bias = torch.nn.Parameter(conv.bias + 1.0)  # replaced, not written
        got2 = model(ids)
        for m in model.modules():
            m.__dict__.pop("fast", None)
        ref2 = model(ids)
        conv.bias.data.sub_(1.0)
        ref = model(ids)
    assert torch.allclose(got, ref, atol=1e-5) and torch.allclose(got2, ref2, atol=1e-5)


@compiled
def test_a_copy_of_a_packed_layer_is_never_served():
    lin = SmallLinear(rand(8, 16), rand(16))
    twin = copy.deepcopy(lin)
    assert twin.packed is None and not twin.fresh(lin_weight := rand(8, 16)) and lin_weight is not None
    with pytest.raises(RuntimeError, match="pack the model again"):
        twin(rand(1, 8))


@compiled
def test_a_trainable_bias_keeps_torchs_kernel_so_it_gets_its_gradient():
    model = tiny_model()
    use_small_kernel(model)
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith("bias"))
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    assert model.transformer.h[0].mlp.c_fc.bias.grad is not None


@compiled
@pytest.mark.parametrize("x", [torch.zeros(2, 64, dtype=torch.float64), torch.zeros(2, 16), torch.zeros(1, 2, 64)])
def test_small_linear_refuses_an_input_it_cannot_read(x):
    with pytest.raises(ValueError, match="x must be a float32 CPU tensor"):
        SmallLinear(rand(64, 32), None)(x)


def test_weights_made_in_inference_mode_keep_torchs_kernel():
    with torch.inference_mode():
        model = tiny_model()
    path = use_small_kernel(model)
    assert path.name == "torch" and ("inference mode" in path.reason or kernel_path().name != "compiled")


@compiled
def test_the_kernel_builds_where_the_cache_is_on_another_file_system(monkeypatch):
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm here to put the cache on another file system")
    with tempfile.TemporaryDirectory(dir=shm) as cache:
        monkeypatch.setenv("SPECREF_CACHE", cache)
        kernels._library.cache_clear()
        try:
            assert kernel_path().name == "compiled", kernel_path().reason
        finally:
            kernels._library.cache_clear()
