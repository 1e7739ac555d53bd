"""A handle on an object the other process owns: every use of it is a call to that process.

The rule: a `Remote` holds no data, only (peer, handle id, kind). Calling it, its len, indexing and iteration (`in`),
float(), int(), index() and its public attributes are requests to the owner; a private name (a leading
underscore: __dict__, __code__, _secret) is refused here and again by the owner; it cannot be set, deleted
or pickled. An operator or its truth value is asked of the owner only where the peer's policy allows it
(`check_operator`: the trusted side refuses them while its checks run).
"""

from __future__ import annotations


class Remote:
    """A handle on an object the other process owns; every use is a call to that process."""

    __slots__ = ("_peer", "_hid", "_kind")

    def __init__(self, peer, hid: int, kind: str):
        object.__setattr__(self, "_peer", peer)
        object.__setattr__(self, "_hid", hid)
        object.__setattr__(self, "_kind", kind)

    def __call__(self, *args, **kwargs):
        return self._peer.request("call", self._hid, args, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(f"{name!r}: private attributes are not reachable through the grading wall")
        return self._peer.request("getattr", self._hid, name)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"cannot set {name!r} on an object of the other process")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete {name!r} of an object of the other process")

    def __len__(self) -> int:
        return self._peer.request("len", self._hid)

    def __getitem__(self, key):
        return self._peer.request("getitem", self._hid, key)

    def __iter__(self):
        return iter(self._peer.request("iter", self._hid))

    def __bool__(self) -> bool:
        self._peer.policy.check_operator(self._peer, self, "its truth (bool, if, assert, and, or, not)")
        return self._peer.request("bool", self._hid)

    def __repr__(self) -> str:
        return f"<{self._kind} object of the other process>"

    def __hash__(self) -> int:
        return hash((id(self._peer), self._hid))

    def __float__(self) -> float:
        return self._peer.request("op", self._hid, "float", None, False)

    def __int__(self) -> int:
        return self._peer.request("op", self._hid, "int", None, False)

    def __index__(self) -> int:
        return self._peer.request("op", self._hid, "index", None, False)

    def __reduce__(self):
        raise TypeError("a remote object cannot be pickled")


SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%", "pow": "**",
           "matmul": "@", "and_": "&", "or_": "|", "xor": "^", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
           "eq": "==", "ne": "!=", "neg": "unary -", "pos": "unary +", "abs": "abs()", "invert": "~"}
BINARY = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_", "or_", "xor")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
UNARY = ("neg", "pos", "abs", "invert")


def _binary(name: str, reflected: bool = False):
    def method(self, other):
        self._peer.policy.check_operator(self._peer, self, f"an operator ({SYMBOLS[name]})" if name not in COMPARE
                                         else f"a comparison ({SYMBOLS[name]}) with another value")
        return self._peer.request("op", self._hid, name, other, reflected)
    method.__name__ = f"__{'r' if reflected else ''}{name.rstrip('_')}__"
    return method


def _unary(name: str):
    def method(self):
        self._peer.policy.check_operator(self._peer, self, f"an operator ({SYMBOLS[name]})")
        return self._peer.request("op", self._hid, name, None, False)
    method.__name__ = f"__{name}__"
    return method


for _n in BINARY:
    setattr(Remote, f"__{_n.rstrip('_')}__", _binary(_n))
    setattr(Remote, f"__r{_n.rstrip('_')}__", _binary(_n, True))
for _n in COMPARE:
    setattr(Remote, f"__{_n}__", _binary(_n))
for _n in UNARY:
    setattr(Remote, f"__{_n}__", _unary(_n))
