"""`KVCache` is the one owner of its lengths: it changes the `[B]` tensor in place, and nothing else assigns it.

A captured CUDA graph reads and writes the lengths at the address it saw at capture, so the tensor
must never be rebound: `advance`, `set`, `truncate` and `compact` write into it. Beside it the cache
keeps `bound`, a host-side upper bound on the longest row, from which a pass chooses its shapes
(`capacity`) without reading the lengths back. The AST walk below fails if any module of the package
or the grader assigns a `.lengths` it does not own, or changes a cache's lengths in place outside
kvcache.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from specref.models.kvcache import KVCache

ROOT = Path(__file__).resolve().parents[1]
# Who may assign `self.lengths`: the cache, and the token buffer of the decoding loop (its own lengths, no cache's).
OWNERS = {("specref/models/kvcache.py", "KVCache"), ("specref/decoding/loop.py", "Sequences")}


def _lengths_writes(source: str, rel: str) -> list[tuple[int, str]]:
    """(line, what) for each assignment to `<x>.lengths`, and each in-place method called on one, outside its
    owner, in the module at `rel` (its path from the repository's root); kvcache.py may do anything."""
    if rel == "specref/models/kvcache.py":
        return []
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            visit(child, child.name if isinstance(child, ast.ClassDef) else cls)
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for t in ast.walk(target):  # tuple targets included
                if isinstance(t, ast.Attribute) and t.attr == "lengths":
                    own = isinstance(t.value, ast.Name) and t.value.id == "self" and (rel, cls) in OWNERS
                    if not own:
                        found.append((node.lineno, f"assigns {ast.unparse(t)}"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if isinstance(f.value, ast.Attribute) and f.value.attr == "lengths" and f.attr.endswith("_") \
                    and not f.attr.startswith("_"):
                found.append((node.lineno, f"changes {ast.unparse(f.value)} in place ({f.attr})"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value == "lengths":
            found.append((node.lineno, "setattr(..., 'lengths', ...)"))

    visit(tree, None)
    return found


def _modules() -> list[Path]:
    return sorted(p for d in ("specref", "specref_grading") for p in (ROOT / d).rglob("*.py"))


def test_nothing_but_the_cache_assigns_a_caches_lengths():
    offenders = {}
    for p in _modules():
        rel = p.relative_to(ROOT).as_posix()
        if found := _lengths_writes(p.read_text(), rel):
            offenders[rel] = found
    assert not offenders, f"only KVCache's methods may change a cache's lengths: {offenders}"


def test_the_walk_flags_a_rebinding_and_an_in_place_write():
    # Negative control: the same walk on code that rebinds and writes a cache's lengths, as a module of the package.
    source = ("def f(cache, T):\n    cache.lengths = cache.lengths + T\n    cache.lengths.copy_(cache.lengths)\n"
              "    a, cache.lengths = 1, 2\n    setattr(cache, 'lengths', 3)\n    cache.lengths += 1\n"
              "class Sequences:\n    def f(self):\n        self.lengths = 0\n")
    found = _lengths_writes(source, "specref/decoding/chain.py")
    assert [line for line, _ in found] == [2, 3, 4, 5, 6, 9], found
    assert _lengths_writes("class Sequences:\n    def f(self):\n        self.lengths = 0\n",
                           "specref/decoding/loop.py") == []  # the token buffer owns its own lengths


def _cache(B: int = 3, S: int = 64) -> KVCache:
    return KVCache(1, B, 1, 2, S)


def test_the_lengths_tensor_keeps_its_address_through_every_method():
    cache = _cache()
    ptr = cache.lengths.data_ptr()
    before = cache.lengths
    cache.advance(5)
    cache.truncate(torch.tensor([5, 3, 4]))
    cache.truncate(torch.tensor([4, 3, 4]), check=False)
    cache.set(torch.tensor([6, 2, 1]), 6)
    cache.compact([[0, 1], [1], []])
    assert cache.lengths is before and cache.lengths.data_ptr() == ptr
    assert cache.lengths.tolist() == [2, 1, 0] and cache.bound == 2


def test_the_bound_stays_an_upper_bound_and_tightens_where_the_host_knows():
    cache = _cache()
    cache.advance(7)
    assert cache.bound == 7
    cache.truncate(torch.tensor([3, 5, 4]))
    assert cache.bound == 7  # shrinking keeps an upper bound without reading the lengths
    cache.truncate(torch.tensor([3, 5, 4]), check=False, bound=5)
    assert cache.bound == 5
    cache.set(torch.tensor([1, 2, 9]), 9)
    assert cache.bound == 9 and cache.tighten() == 9
    cache.set(torch.tensor([1, 2, 3]))  # no bound given: read back
    assert cache.bound == 3


@pytest.mark.parametrize("bound, T, S", [(0, 1, 16), (14, 2, 16), (15, 2, 32), (31, 1, 32), (40, 5, 64), (60, 4, 64)])
def test_capacity_is_the_next_power_of_two_at_least_16_at_most_max_len(bound, T, S):
    cache = _cache(S=64)
    cache.advance(bound)
    assert cache.capacity(T) == S
    assert bound + T <= cache.capacity(T) <= max(16, 2 * (bound + T))  # at most about twice what is needed


def test_capacity_refuses_a_pass_past_the_cache():
    cache = _cache(S=20)
    cache.advance(18)
    assert cache.capacity(2) == 20  # the bucket is cut at max_len
    with pytest.raises(ValueError, match="max_len=20"):
        cache.capacity(3)


def test_truncate_still_refuses_to_grow_when_checked():
    cache = _cache()
    cache.advance(3)
    with pytest.raises(ValueError, match="new_lengths must satisfy"):
        cache.truncate(torch.tensor([4, 3, 3]))
