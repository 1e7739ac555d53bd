"""The grading wall's wire: calls between the trusted checks and the jailed learner kernel, plain data only.

Two processes talk over a pair of pipes. Each side is a `Peer`; either may call the other,
and while one waits for an answer it serves the other's calls (nested calls: the check calls
the learner's function, which calls the model the check handed it, ...).

What crosses, and how (nothing is pickled; a message is a JSON header and raw byte blobs):

* None, bool, int, float, str; lists, tuples, dicts and sets of them, as copies;
* torch tensors and numpy arrays (numeric dtypes), as their bytes: the receiver gets its own
  copy. When the callee changed a tensor or array argument in place, the new contents are
  copied back into the caller's object when the call returns, so "must not modify its input"
  is still seen by the caller;
* a torch.Generator, as its state (the seed it was made with is blanked); the caller's
  generator takes the callee's final state when the call returns, so drawing from a passed
  generator advances it on both sides;
* anything else is served, not sent: the receiver gets a `Remote` handle. Calling it, its
  len / indexing / iteration, and reading its public attributes are calls back to the owner.
  Private names (a leading underscore: __dict__, __code__, __closure__, _secret) are refused
  by the owner, whatever the client asks.

The trusted side serves less (`Peer(..., trusted=True)`): attributes only of torch and specref
objects, never a module, a class or a function's attributes.
"""

from __future__ import annotations

import builtins
import json
import os
import re
import select
import struct
import time
import types

MAX_MESSAGE = 1 << 28  # bytes of one message (header and blobs); a longer one breaks the channel
MAX_ITEMS = 1 << 20  # items of one container, or of one iteration
MAX_DEPTH = 64
# One message's JSON header: at most this many bytes and this many items (values and containers, counted across
# all its nested containers together), checked on the raw bytes BEFORE they are parsed: a reply of a million
# tiny lists costs the receiver a scan of its bytes, never the million lists. Tensors and arrays travel as blobs
# and count one item each. The limits are orders of magnitude above what an honest grading sends (measured in
# benchmarks/history/2026-12-04.md) and leave room for learners' lists of many thousands of values.
MAX_HEADER = 1 << 26
MAX_MESSAGE_ITEMS = 1 << 18
_JSON_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')


class ChannelClosed(BaseException):
    """The other process is gone or broke the protocol (a BaseException: no check's `except Exception` eats it)."""


class CallTimeout(BaseException):
    """The other process did not answer within the per-call time limit."""


class MessageRefused(ChannelClosed):
    """The other process sent a message past this side's limits (bytes, items): the channel is broken."""


class CallLimit(BaseException):
    """More calls across the wall than `Peer.call_limit` allows (the trusted side's cap per test cell)."""


class RemoteError(Exception):
    """An exception raised on the other side whose type is not a builtin one."""


_BUILTIN_ERRORS = {n: getattr(builtins, n) for n in dir(builtins)
                   if isinstance(getattr(builtins, n), type) and issubclass(getattr(builtins, n), Exception)
                   and n not in ("StopIteration", "StopAsyncIteration", "GeneratorExit")}
_TRUSTED_ATTR_MODULES = ("specref", "specref_grading", "torch")  # specref_grading: the checks' model wrappers
_MODULE_MUTATORS = {"add_module", "apply", "to", "to_empty", "cuda", "cpu", "xpu", "ipu", "mtia", "type", "float",
                    "double", "half", "bfloat16", "train", "requires_grad_", "zero_grad", "share_memory",
                    "compile"}


def _torch():
    import sys
    return sys.modules.get("torch")


def _np():
    import sys
    return sys.modules.get("numpy")


class Remote:
    """A handle on an object the other process owns; every use is a call to that process."""

    __slots__ = ("_peer", "_hid", "_kind")

    def __init__(self, peer: Peer, hid: int, kind: str):
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

    def __contains__(self, x) -> bool:
        return x in self._peer.request("iter", self._hid)

    def __bool__(self) -> bool:
        _refuse_on_trusted_side(self, "its truth (bool, if, assert, and, or, not)")
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


def _refuse_on_trusted_side(remote: Remote, what: str) -> None:
    """The checks' own code may not let an object of the submission answer an operator, or its own truth.

    The answer would come from the kernel, which can say anything: an object whose __sub__ gives 0 passes
    `abs(got - want) < tol`, one whose __bool__ says True passes `assert got`, one whose __eq__ says True equals
    every expected value. Only what copies plain data stays: len, iteration, indexing, float(), int(), index().
    While the trusted side answers a call of the kernel (`Peer.answering`: the course's code the submission
    called, a sampler handed to it running on the submission's rng), what that code computes goes back to the
    submission, which could have computed it itself: there an operator is asked of the kernel as before.
    """
    peer = remote._peer
    if peer.trusted and not peer.answering:
        raise TypeError(f"the checks cannot use {what} of a value of the submission's own type ({remote._kind}): "
                        "return plain data (numbers, strings, lists, dicts, tensors, arrays)")


_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%", "pow": "**",
            "matmul": "@", "and_": "&", "or_": "|", "xor": "^", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
            "eq": "==", "ne": "!=", "neg": "unary -", "pos": "unary +", "abs": "abs()", "invert": "~"}


def _binary(name: str, reflected: bool = False):
    def method(self, other):
        _refuse_on_trusted_side(self, f"an operator ({_SYMBOLS[name]})" if name not in _COMPARE else
                                f"a comparison ({_SYMBOLS[name]}) with another value")
        return self._peer.request("op", self._hid, name, other, reflected)
    method.__name__ = f"__{'r' if reflected else ''}{name.rstrip('_')}__"
    return method


def _unary(name: str):
    def method(self):
        _refuse_on_trusted_side(self, f"an operator ({_SYMBOLS[name]})")
        return self._peer.request("op", self._hid, name, None, False)
    method.__name__ = f"__{name}__"
    return method


_BINARY = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_", "or_", "xor")
_COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
_UNARY = ("neg", "pos", "abs", "invert")
for _n in _BINARY:
    setattr(Remote, f"__{_n.rstrip('_')}__", _binary(_n))
    setattr(Remote, f"__r{_n.rstrip('_')}__", _binary(_n, True))
for _n in _COMPARE:
    setattr(Remote, f"__{_n}__", _binary(_n))
for _n in _UNARY:
    setattr(Remote, f"__{_n}__", _unary(_n))


# --------------------------------------------------------------------------------------
# Framing: 4-byte header length, JSON header {"blobs": [sizes], ...}, then the blobs
# --------------------------------------------------------------------------------------
def _write_all(fd: int, data: bytes, deadline: float | None) -> None:
    view = memoryview(data)
    while view:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        _, ready, _ = select.select([], [fd], [], wait)
        if not ready:
            raise CallTimeout("the other process stopped reading its channel")
        try:
            n = os.write(fd, view[: 1 << 16])
        except BlockingIOError:
            continue
        except OSError as e:
            raise ChannelClosed(f"the channel was closed ({e})") from None
        view = view[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    parts, got = [], 0
    while got < n:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([fd], [], [], wait)
        if not ready:
            raise CallTimeout("no answer within the time limit")
        try:
            chunk = os.read(fd, min(n - got, 1 << 20))
        except BlockingIOError:
            continue
        except OSError as e:
            raise ChannelClosed(f"the channel was closed ({e})") from None
        if not chunk:
            raise ChannelClosed("the other process closed the channel")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


# --------------------------------------------------------------------------------------
# The peer
# --------------------------------------------------------------------------------------
class _Frame:
    """What one message carries besides its JSON: blobs, and the tensors and generators it passed."""

    def __init__(self, blobs: list[bytes] | None = None):
        self.blobs = blobs if blobs is not None else []
        self.items = 0  # values encoded or decoded in this message so far (MAX_MESSAGE_ITEMS)
        self.arrays: list = []  # tensors / arrays in the order they were encoded or decoded
        self.array_bytes: list[bytes] = []
        self.gens: list[str] = []


class Peer:
    def __init__(self, rfd: int, wfd: int, side: str, timeout: float | None = None, trusted: bool = False,
                 ops: dict | None = None):
        self.rfd, self.wfd, self.side, self.timeout, self.trusted = rfd, wfd, side, timeout, trusted
        os.set_blocking(wfd, False)
        self.exports: dict[int, object] = {}
        self.export_ids: dict[int, int] = {}
        self.proxies: dict[int, Remote] = {}
        self.gens: dict[str, object] = {}
        self.gen_keys: dict[int, str] = {}
        self.counter = 0
        self.ops = dict(ops or {})
        self.broken: str = ""
        self.calls = 0  # calls this side made
        self.served = 0  # calls this side answered
        self.call_limit: int | None = None  # calls + served past which a call raises CallLimit (None: no cap)
        self.serving: set[int] = set()  # ids of what the trusted side serves the kernel by name (a class too)
        self.answering = 0  # calls of the other side this side is answering now (nested)
        # The keys of the generators each call on this side's stack lent the other side (`frame.gens`): the other
        # side may set the state of one of ours only while it is lent (_decode_gen, _sync_back).
        self.lent: list[list[str]] = []
        # Calls that came back with arrays the callee changed in place (the handle called, or None), recorded on the
        # trusted side: trusted.run_test reads and clears them per test and flags the test.
        self.changed: list[int | None] = []
        self.peak_head = self.peak_items = self.peak_sent = 0  # the largest messages: received (bytes, items), sent

    # ---- encoding -------------------------------------------------------------------
    def _new_id(self) -> int:
        self.counter += 1
        return self.counter

    def encode(self, x, frame: _Frame, depth: int = 0):
        if depth > MAX_DEPTH:
            raise ValueError("the value is nested too deeply to be passed between processes")
        frame.items += 1
        if frame.items > MAX_MESSAGE_ITEMS:
            raise ValueError(f"a value of more than {MAX_MESSAGE_ITEMS} items (counted across its nested lists, "
                             "tuples, dicts and sets) is too large to be passed between processes")
        t = type(x)
        if x is None or t is bool or t is str:
            return x
        if t is int:
            return x if -(2**63) <= x < 2**63 else {"$big": str(x)}
        if t is float:
            return {"$f": repr(x)} if x != x or x in (float("inf"), float("-inf")) else x
        if t is list or t is tuple or t is set or t is frozenset:
            items = list(x)
            if len(items) > MAX_ITEMS:
                raise ValueError("a container too long to be passed between processes")
            enc = [self.encode(v, frame, depth + 1) for v in items]
            return enc if t is list else {"$T" if t is tuple else "$S": enc}
        if t is dict:
            if len(x) > MAX_ITEMS:
                raise ValueError("a dict too long to be passed between processes")
            return {"$D": [[self.encode(k, frame, depth + 1), self.encode(v, frame, depth + 1)]
                           for k, v in dict.items(x)]}
        torch, np = _torch(), _np()
        if isinstance(x, Remote) and x._peer is self:
            return {"$h": x._hid, "own": False}
        if torch is not None:
            if isinstance(x, torch.Tensor):
                return self._encode_array(x, frame, torch=True)
            if t is torch.Generator:
                return self._encode_gen(x, frame)
            if t is torch.dtype:
                return {"$dt": str(x).removeprefix("torch.")}
            if t is torch.Size:
                return {"$T": [int(v) for v in x]}
            if t is torch.device:
                return {"$dev": str(x)}
        if np is not None:
            if isinstance(x, np.ndarray):
                return self._encode_array(x, frame, torch=False)
            if isinstance(x, np.generic):
                return self.encode(x.item(), frame, depth + 1)
        if t is slice:
            return {"$sl": [self.encode(v, frame, depth + 1) for v in (x.start, x.stop, x.step)]}
        if t is range:
            return {"$r": [x.start, x.stop, x.step]}
        if x is Ellipsis:
            return {"$e": 1}
        dc = _frozen_specref_dataclass(t)
        if dc:  # a record of specref's (a Markov chain, a recorded step): its fields, as a copy
            import dataclasses
            return {"$dc": dc, "fields": {f.name: self.encode(getattr(x, f.name), frame, depth + 1)
                                          for f in dataclasses.fields(x) if f.init}}
        if not self.trusted:  # the learner's subclasses of plain types arrive as the plain type
            for base in (bool, int, float, str, tuple, list, dict, set, frozenset):
                if isinstance(x, base):
                    return self.encode(base(x) if base not in (int, float, str) else base.__new__(base, x), frame,
                                       depth)
        return self._export(x)

    def _export(self, x) -> dict:
        if self.trusted and id(x) not in self.serving:
            if isinstance(x, (types.ModuleType, type)):
                raise TypeError("the grader passes no modules or classes to the submission")
            if callable(x) and not _course_callable(x):
                raise TypeError(f"the grader passes no {type(x).__name__} {_origin(x)} to the submission: only the "
                                "course's own functions, and methods of its objects")
        key = id(x)
        hid = self.export_ids.get(key)
        if hid is None or self.exports.get(hid) is not x:
            hid = self._new_id()
            self.exports[hid] = x
            self.export_ids[key] = hid
        kind = getattr(type(x), "__qualname__", "object")
        return {"$h": hid, "own": True, "kind": kind if isinstance(kind, str) else "object"}

    def _encode_array(self, x, frame: _Frame, torch: bool) -> dict:
        np = _np()
        tag = ""
        if torch:
            tmod = _torch()
            with tmod._C.DisableTorchFunctionSubclass():
                a = tmod.Tensor.contiguous(tmod.Tensor.cpu(tmod.Tensor.detach(x)))
                if a.dtype == tmod.bfloat16:
                    a, tag = a.float(), "bf16"
                arr = tmod.Tensor.numpy(a)
        else:
            arr = np.ascontiguousarray(x)
            if type(arr) is not np.ndarray:
                arr = np.array(arr, copy=True, subok=False)
        if arr.dtype.hasobject or arr.dtype.kind not in "biufc":
            raise TypeError(f"an array of dtype {arr.dtype} cannot be passed between processes")
        data = arr.tobytes()
        frame.blobs.append(data)
        frame.arrays.append(x)
        frame.array_bytes.append(data)
        return {"$a": len(frame.blobs) - 1, "dtype": arr.dtype.str, "shape": list(arr.shape), "torch": torch,
                "tag": tag, "i": len(frame.arrays) - 1}

    def _encode_gen(self, g, frame: _Frame) -> dict:
        key = self.gen_keys.get(id(g))
        if key is None or self.gens.get(key) is not g:
            key = f"{self.side}:{self._new_id()}"
            self.gens[key] = g
            self.gen_keys[id(g)] = key
        if key not in frame.gens:
            frame.gens.append(key)
        return {"$g": key, "state": self._gen_state_blob(g, frame)}

    def _gen_state_blob(self, g, frame: _Frame) -> int:
        state = bytes(g.get_state().tolist())
        state = b"\0" * 8 + state[8:]  # the seed it was made with stays with its owner
        frame.blobs.append(state)
        return len(frame.blobs) - 1

    def decode(self, x, frame: _Frame, depth: int = 0):
        if depth > MAX_DEPTH:
            raise ValueError("nested too deeply")
        frame.items += 1
        if frame.items > MAX_MESSAGE_ITEMS:
            raise ValueError("too many items in one message")
        t = type(x)
        if x is None or t in (bool, int, float, str):
            return x
        if t is list:
            return [self.decode(v, frame, depth + 1) for v in x]
        if t is not dict or len(x) == 0:
            raise ValueError("malformed value")
        if "$T" in x:
            return tuple(self.decode(v, frame, depth + 1) for v in x["$T"])
        if "$S" in x:
            return set(self.decode(v, frame, depth + 1) for v in x["$S"])
        if "$D" in x:
            return {self.decode(k, frame, depth + 1): self.decode(v, frame, depth + 1) for k, v in x["$D"]}
        if "$f" in x:
            return float(x["$f"])
        if "$big" in x:
            return int(x["$big"])
        if "$a" in x:
            return self._decode_array(x, frame)
        if "$g" in x:
            return self._decode_gen(x, frame)
        if "$h" in x:
            hid = x["$h"]
            if type(hid) is not int:
                raise ValueError("malformed handle")
            if not x.get("own"):  # one of ours, coming back
                if hid not in self.exports:
                    raise ValueError("a handle this process never gave out")
                return self.exports[hid]
            proxy = self.proxies.get(hid)
            if proxy is None:
                kind = x.get("kind")
                proxy = self.proxies[hid] = Remote(self, hid, kind if type(kind) is str else "object")
            return proxy
        if "$dc" in x:
            cls = _dataclass_named(str(x["$dc"]))
            fields = x["fields"]
            if type(fields) is not dict:
                raise ValueError("malformed record")
            return cls(**{str(k): self.decode(v, frame, depth + 1) for k, v in fields.items()})
        if "$dt" in x:
            torch = _torch()
            dt = getattr(torch, str(x["$dt"]), None)
            if type(dt) is not torch.dtype:
                raise ValueError("malformed dtype")
            return dt
        if "$dev" in x:
            return _torch().device(str(x["$dev"]))
        if "$sl" in x:
            return slice(*[self.decode(v, frame, depth + 1) for v in x["$sl"]])
        if "$r" in x:
            return range(*[int(v) for v in x["$r"]])
        if "$e" in x:
            return Ellipsis
        raise ValueError("malformed value")

    def _decode_array(self, x: dict, frame: _Frame):
        np = _np()
        data = frame.blobs[int(x["$a"])]
        dt = np.dtype(str(x["dtype"]))
        if dt.hasobject or dt.kind not in "biufc":
            raise ValueError("refused dtype")
        shape = tuple(int(s) for s in x["shape"])
        if any(s < 0 for s in shape) or int(np.prod(shape, dtype=np.int64)) * dt.itemsize != len(data):
            raise ValueError("array size does not match its data")
        arr = np.frombuffer(data, dtype=dt).reshape(shape).copy()
        if x.get("torch"):
            torch = _torch()
            out = torch.from_numpy(arr)
            if x.get("tag") == "bf16":
                out = out.to(torch.bfloat16)
        else:
            out = arr
        frame.arrays.append(out)
        frame.array_bytes.append(data)
        return out

    def _decode_gen(self, x: dict, frame: _Frame):
        torch = _torch()
        key = str(x["$g"])
        g = self.gens.get(key)
        if g is None:
            if key.split(":")[0] == self.side:
                raise ValueError("a generator this process never gave out")
            g = self.gens[key] = torch.Generator()
            self.gen_keys[id(g)] = key
        elif key.split(":")[0] == self.side and not self._lent(key):
            # One of ours that no call on our stack lends now: the other side may not set its state (keys are
            # sequential, so guessable). It gets a generator of its own, in the state it sent.
            g = torch.Generator()
            data = frame.blobs[int(x["state"])]
            if len(data) != g.get_state().numel():
                raise ValueError("a generator state of the wrong size")
            g.set_state(torch.tensor(list(data), dtype=torch.uint8))
            return g
        self._set_state(g, frame.blobs[int(x["state"])])
        if key not in frame.gens:
            frame.gens.append(key)
        return g

    def _lent(self, key: str) -> bool:
        return any(key in gens for gens in self.lent)

    def _set_state(self, g, data: bytes) -> None:
        torch = _torch()
        old = g.get_state()
        if len(data) != old.numel():
            raise ValueError("a generator state of the wrong size")
        new = torch.tensor(list(data), dtype=torch.uint8)
        if self.gen_keys.get(id(g), "").startswith(self.side + ":"):
            new[:8] = old[:8]  # our own generator keeps its seed
        g.set_state(new)

    # ---- messages -------------------------------------------------------------------
    def _send(self, header: dict, frame: _Frame, deadline: float | None) -> None:
        header["blobs"] = [len(b) for b in frame.blobs]
        self.peak_sent = max(self.peak_sent, frame.items)
        head = json.dumps(header, ensure_ascii=True, allow_nan=False).encode("ascii")
        if len(head) + sum(header["blobs"]) > MAX_MESSAGE:
            raise ValueError("a value too large to be passed between processes")
        # One write per message where it is small: every write wakes the reader, which costs on a busy machine.
        _write_all(self.wfd, b"".join([struct.pack(">I", len(head)), head, *frame.blobs]), deadline)

    def _recv(self, deadline: float | None) -> tuple[dict, _Frame]:
        (n,) = struct.unpack(">I", _read_exact(self.rfd, 4, deadline))
        if n > MAX_MESSAGE or n > MAX_HEADER:
            raise MessageRefused(f"a message of more than {min(MAX_MESSAGE, MAX_HEADER) >> 20} MB of plain values "
                                 f"({n >> 20} MB)")
        head = _read_exact(self.rfd, n, deadline)
        items = json_items(head)
        self.peak_head, self.peak_items = max(self.peak_head, n), max(self.peak_items, items)
        if items > MAX_MESSAGE_ITEMS:
            raise MessageRefused(f"a message of more than {MAX_MESSAGE_ITEMS} values (about {items}, counted across "
                                 "its nested lists, tuples, dicts and sets)")
        try:
            header = json.loads(head)
            sizes = header["blobs"]
            if type(sizes) is not list or any(type(s) is not int or s < 0 for s in sizes) or \
                    sum(sizes) + n > MAX_MESSAGE:
                raise ValueError
        except (ValueError, KeyError, TypeError, RecursionError):
            raise ChannelClosed("the other process sent a malformed message") from None
        return header, _Frame([_read_exact(self.rfd, s, deadline) for s in sizes])

    def _deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    def request(self, op: str, *args):
        """Ask the other side to do `op`; serve its calls meanwhile; return its answer or raise its error."""
        if self.broken:
            raise ChannelClosed(self.broken)
        self.calls += 1
        self._count()
        rid = self._new_id()
        frame = _Frame()
        try:
            header = {"op": op, "id": rid, "args": [self.encode(a, frame) for a in args]}
        except RecursionError:
            raise ValueError("a value nested too deeply to be passed between processes") from None
        self.lent.append(frame.gens)  # lent until this call returns: the calls it serves meanwhile included
        try:
            try:
                self._send(header, frame, self._deadline())
                while True:
                    msg, rframe = self._recv(self._deadline())
                    if "op" in msg:
                        self._serve(msg, rframe)
                        continue
                    if msg.get("re") != rid:
                        raise ChannelClosed("the other process answered a call that was never made")
                    break
            except (ChannelClosed, CallTimeout) as e:
                self.broken = self.broken or str(e)
                raise
            try:
                self._sync_back(msg, rframe, frame)
                if self.trusted and msg.get("back"):
                    # The callee changed in place an array this side passed it: a check's input, or the course's
                    # own tensor handed on by code the submission called.
                    self.changed.append(args[0] if args and type(args[0]) is int else None)
                if "err" in msg:
                    name, text = msg["err"]
                    error = _rebuild_error(str(name), str(text))
                else:
                    return self.decode(msg.get("ok"), rframe)
            except (ValueError, KeyError, TypeError, IndexError, RecursionError):
                self.broken = "the other process sent a malformed answer"
                raise ChannelClosed(self.broken) from None
        finally:
            self.lent.pop()
        raise error

    def _sync_back(self, msg: dict, rframe: _Frame, frame: _Frame) -> None:
        """Copy back what the callee did to the arrays and generators this call passed it."""
        torch, np = _torch(), _np()
        for i, blob in msg.get("back", []):
            orig = frame.arrays[int(i)]
            data = rframe.blobs[int(blob)]
            if len(data) != len(frame.array_bytes[int(i)]):
                raise ValueError("array copied back with another size")
            if torch is not None and isinstance(orig, torch.Tensor):
                arr = np.frombuffer(data, dtype=torch.Tensor.numpy(torch.Tensor.cpu(
                    torch.Tensor.detach(orig[:0].float() if orig.dtype == torch.bfloat16 else orig[:0]))).dtype)
                new = torch.from_numpy(arr.copy()).reshape(orig.shape)
                with torch.no_grad():
                    orig.copy_(new)
            else:
                orig[...] = np.frombuffer(data, dtype=orig.dtype).reshape(orig.shape)
        for key, blob in msg.get("gens", []):
            g = self.gens.get(str(key))
            if g is not None and self._lent(str(key)):  # only a generator a call on our stack lent it
                self._set_state(g, rframe.blobs[int(blob)])

    def _count(self) -> None:
        if self.call_limit is not None and self.calls + self.served > self.call_limit:
            self.broken = self.broken or "the cap on calls across the wall was reached"
            raise CallLimit(self.broken)

    def _serve(self, msg: dict, frame: _Frame) -> None:
        self.served += 1
        self._count()
        self.answering += 1
        try:
            self._answer(msg, frame)
        finally:
            self.answering -= 1

    def _answer(self, msg: dict, frame: _Frame) -> None:
        rid = msg.get("id")
        out = _Frame()
        reply: dict = {"re": rid}
        n_in = 0
        try:
            args = [self.decode(a, frame) for a in msg.get("args", [])]
            n_in = len(frame.arrays)
            value = self._do(str(msg.get("op")), args)
            reply["ok"] = self.encode(value, out)
        except (ChannelClosed, CallTimeout):
            raise
        except BaseException as e:  # noqa: BLE001 - the caller gets the error, whatever it is
            reply = {"re": rid, "err": [type(e).__name__, _message(e)]}
            out = _Frame()
        back = []
        for i in range(min(n_in, len(frame.arrays))):
            try:
                data = self._array_bytes(frame.arrays[i])
            except Exception:  # noqa: BLE001
                continue
            if data != frame.array_bytes[i] and len(data) == len(frame.array_bytes[i]):
                out.blobs.append(data)
                back.append([i, len(out.blobs) - 1])
        reply["back"] = back
        gens = []
        for key in frame.gens:
            g = self.gens.get(key)
            if g is not None:
                gens.append([key, self._gen_state_blob(g, out)])
        reply["gens"] = gens
        self._send(reply, out, self._deadline())

    def _array_bytes(self, x) -> bytes:
        torch = _torch()
        if torch is not None and isinstance(x, torch.Tensor):
            a = x.detach().cpu().contiguous()
            if a.dtype == torch.bfloat16:
                a = a.float()
            return a.numpy().tobytes()
        return _np().ascontiguousarray(x).tobytes()

    def _do(self, op: str, args: list):
        if op in self.ops:
            return self.ops[op](*args)
        if not args or type(args[0]) is not int or args[0] not in self.exports:
            raise ValueError(f"unknown object in a {op!r} call")
        obj = self.exports[args[0]]
        if op == "call":
            a, kw = args[1], args[2]
            if type(a) is not tuple or type(kw) is not dict or any(type(k) is not str for k in kw):
                raise TypeError("malformed call")
            if not callable(obj):
                raise TypeError(f"{type(obj).__name__!r} object is not callable")
            return obj(*a, **kw)
        if op == "getattr":
            name = args[1]
            if type(name) is not str or name.startswith("_"):
                raise AttributeError(f"{name!r}: private attributes are not reachable through the grading wall")
            if self.trusted:
                mod = (getattr(type(obj), "__module__", "") or "").split(".")[0]
                if mod not in _TRUSTED_ATTR_MODULES or isinstance(obj, (types.FunctionType, types.MethodType)):
                    raise AttributeError(f"the attributes of a {type(obj).__name__} the grader passed are not "
                                         "readable; call it instead")
                torch = _torch()
                if torch is not None and isinstance(obj, torch.nn.Module) and (
                        name.startswith(("register_", "load_", "set_")) or name in _MODULE_MUTATORS):
                    raise AttributeError(f"{name!r}: a model the grader passed cannot be changed (hooks, weights, "
                                         "dtype, device, mode)")
            return getattr(obj, name)
        if op == "getitem":
            return obj[args[1]]
        if op == "len":
            return len(obj)
        if op == "iter":
            items = []
            for v in obj:
                items.append(v)
                if len(items) > MAX_ITEMS:
                    raise ValueError("too many items")
            return items
        if op == "bool":
            return bool(obj)
        if op == "op":
            import operator
            name, other, reflected = args[1], args[2], args[3]
            if name in ("float", "int", "index"):
                return {"float": float, "int": int, "index": operator.index}[name](obj)
            if name not in _BINARY + _COMPARE + _UNARY:
                raise TypeError(f"unsupported operation {name!r}")
            fn = getattr(operator, name)
            if name in _UNARY:
                return fn(obj)
            return fn(other, obj) if reflected else fn(obj, other)
        raise ValueError(f"unknown operation {op!r}")

    def serve_forever(self) -> None:
        """The jail's loop: answer calls until the channel closes."""
        while True:
            try:
                msg, frame = self._recv(None)
            except ChannelClosed:
                return
            if "op" not in msg:
                return
            self._serve(msg, frame)


# What the solution's own cells compile to on the trusted side (specref_grading/trusted.py names them so).
_CELL_FILE = re.compile(r"<(?:checks|setup|test) cell \d+>")


def _course_module(mod: object) -> bool:
    return type(mod) is str and mod.split(".")[0] in _TRUSTED_ATTR_MODULES


def _course_callable(x, depth: int = 0) -> bool:
    """A callable the trusted side may hand to the submission: the course's own code, never the standard library's.

    * a Python function defined in specref, specref_grading or torch, or in one of the solution's cells;
    * a bound method whose function is one of those (a model's forward, a sampler's uniform);
    * a builtin method bound to an object of one of those modules (torch's C methods). A builtin whose
      `__self__` is None or a module (open, eval, exec, os.system, print) is never one: a module-level builtin's
      `__self__` is its module;
    * an object of a class of those modules, or of a class the solution's cells (`__main__`) define, that is
      callable (a model, a sampler object). functools.partial, operator.attrgetter and other callables of the
      standard library are not: they would run what they wrap, or read what they name, on the trusted side.
    """
    if depth > 8:
        return False
    if isinstance(x, types.FunctionType):
        code = x.__code__
        return _course_module(x.__module__) or (x.__module__ == "__main__" and _CELL_FILE.fullmatch(
            code.co_filename) is not None)
    if isinstance(x, types.MethodType):
        return _course_callable(x.__func__, depth + 1)
    if isinstance(x, types.BuiltinFunctionType):  # builtin functions and builtin methods alike
        owner = getattr(x, "__self__", None)
        if owner is None or isinstance(owner, (types.ModuleType, type)):
            return False
        return _course_module(getattr(type(owner), "__module__", None))
    t = type(x)
    if t.__module__ == "__main__":  # a class of the solution's cells; never one of trusted.py's own callables
        return all(not isinstance(v, types.FunctionType) or _course_callable(v, depth + 1)
                   for v in t.__dict__.values())
    return _course_module(t.__module__) and not isinstance(
        x, (types.MethodWrapperType, types.WrapperDescriptorType, types.MethodDescriptorType,
            types.ClassMethodDescriptorType))


def _origin(x) -> str:
    mod, name = getattr(x, "__module__", None), getattr(x, "__qualname__", None)
    if type(mod) is not str:
        owner = getattr(x, "__self__", None)
        mod = getattr(owner, "__name__", None) if isinstance(owner, types.ModuleType) else None
    if type(name) is not str:
        name = getattr(type(x), "__qualname__", "object")
    return repr(f"{mod}.{name}" if type(mod) is str else str(name))


def json_items(head: bytes) -> int:
    """An upper bound on the values in a JSON text (its commas, brackets and braces outside strings, plus one),
    read from its bytes without parsing them."""
    bare = _JSON_STRINGS.sub(b'""', head) if b'"' in head else head
    return bare.count(b",") + bare.count(b"[") + bare.count(b"{") + 1


def _frozen_specref_dataclass(t: type) -> str:
    """'module:qualname' of a frozen dataclass defined in specref (sent by value), else ''."""
    params = t.__dict__.get("__dataclass_params__") if isinstance(t.__dict__, types.MappingProxyType) else None
    mod = getattr(t, "__module__", "")
    if params is None or not getattr(params, "frozen", False) or type(mod) is not str or not mod.startswith("specref."):
        return ""
    return f"{mod}:{t.__qualname__}"


def _dataclass_named(name: str) -> type:
    import sys
    mod, _, qual = name.partition(":")
    if not mod.startswith("specref.") or not qual or "<" in qual or any(p.startswith("_") for p in qual.split(".")):
        raise ValueError("refused record type")
    obj = sys.modules.get(mod)  # only a module this process has imported: a name never imports anything
    if obj is None:
        raise ValueError("refused record type")
    for part in qual.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type) or _frozen_specref_dataclass(obj) != name:
        raise ValueError("refused record type")
    return obj


def _message(e: BaseException) -> str:
    try:
        s = BaseException.__str__(e)
    except Exception:  # noqa: BLE001
        s = "<message could not be read>"
    return s if len(s) <= 20000 else s[:20000] + " [...]"


def describe_error(e: BaseException, filename: str) -> str:
    """'TypeName (line N): message', N the last line of the traceback in `filename` (a cell's source)."""
    import traceback
    if isinstance(e, SyntaxError):
        return f"SyntaxError (line {e.lineno}): {e.msg}"
    where = ""
    try:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == filename]
        if frames:
            where = f" (line {frames[-1].lineno})"
    except Exception:  # noqa: BLE001
        pass
    return f"{type(e).__name__}{where}: {_message(e)}"


def _rebuild_error(name: str, text: str) -> Exception:
    cls = _BUILTIN_ERRORS.get(name)
    if cls is not None:
        try:
            return cls(text)
        except Exception:  # noqa: BLE001
            pass
    return RemoteError(f"{name}: {text}")

