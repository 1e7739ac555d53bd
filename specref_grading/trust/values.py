"""Values across the wall: what a message carries, encoded as plain JSON and byte blobs.

The rule, per value:

* None, bool, int, float, str; lists, tuples, dicts, sets, slices, ranges of them: copies;
* torch tensors and numpy arrays of numeric dtypes: their bytes, a copy the receiver owns. What the callee
  changed in place is copied back into the caller's object when the call returns (calls.py), so "must not
  modify its input" is still seen by the caller;
* a torch.Generator: its state, the seed it was made with blanked. The caller's generator takes the callee's
  final state when the call returns; the other side may set the state of one of ours only while a call on
  our stack lends it;
* a frozen dataclass of specref: its fields (records.py);
* anything else is not sent: it is exported under a handle id, and the receiver gets a `Remote`. What a side
  may export, what leaves in its place (the trusted side: a declared wrapper, exports.py) and what it sends as a
  plain copy is its policy's (kernel_policy.py, trusted_policy.py). Every id (handle, generator key, call) is
  63 random bits from os.urandom (`new_id`), so the other side cannot guess one it was not given; `revoke`
  forgets what was exported since a mark (trusted.py: at the end of each test), so a handle kept from one test
  is refused in the next.

Every message is limited in depth and items while it is encoded or decoded, whatever its bytes say.
"""

from __future__ import annotations

import dataclasses
import secrets
import sys

from specref_grading.trust.records import record_name, record_type
from specref_grading.trust.remote import Remote
from specref_grading.trust.wire import MAX_MESSAGE_ITEMS

MAX_ITEMS = 1 << 20  # items of one container, or of one iteration
MAX_DEPTH = 64
REFUSED = ("a handle this process never gave out, or gave out in a test that has ended (what a check hands out is "
           "valid only while that test runs)")


def _torch():
    return sys.modules.get("torch")


def _np():
    return sys.modules.get("numpy")


class Frame:
    """What one message carries besides its JSON: blobs, and the tensors and generators it passed."""

    def __init__(self, blobs: list[bytes] | None = None):
        self.blobs = blobs if blobs is not None else []
        self.items = 0  # values encoded or decoded in this message so far (MAX_MESSAGE_ITEMS)
        self.arrays: list = []  # tensors / arrays in the order they were encoded or decoded
        self.array_bytes: list[bytes] = []
        self.gens: list[str] = []


def array_bytes(x) -> bytes:
    """The bytes a tensor or array holds now (bfloat16 as float32, as it was sent)."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        a = x.detach().cpu().contiguous()
        if a.dtype == torch.bfloat16:
            a = a.float()
        return a.numpy().tobytes()
    return _np().ascontiguousarray(x).tobytes()


class Codec:
    """One side's encoder and decoder: its table of exported objects, its proxies of the other side's, and
    the generators either side lent."""

    def __init__(self, side: str, policy):
        self.side, self.policy = side, policy
        self.exports: dict[int, object] = {}  # handle id -> what left (a declared wrapper on the trusted side)
        self.originals: dict[int, object] = {}  # handle id -> the object it stands for
        self.export_ids: dict[int, int] = {}
        self.proxies: dict[int, Remote] = {}
        self.gens: dict[str, object] = {}
        self.gen_keys: dict[int, str] = {}
        # The keys of the generators each call on this side's stack lent the other side (`frame.gens`): the other
        # side may set the state of one of ours only while it is lent (_decode_gen, calls.py's sync_back).
        self.lent: list[list[str]] = []

    def new_id(self) -> int:
        """A fresh id: 63 random bits (secrets: os.urandom, never the global RNG), never one this side exported."""
        while True:
            hid = secrets.randbits(63)
            if hid not in self.exports:
                return hid

    def revoke(self, keep: set[int]) -> None:
        """Forget every export whose id is not in `keep` (the ids at a mark): a later use of it is refused."""
        for hid in [h for h in self.exports if h not in keep]:
            del self.exports[hid], self.originals[hid]
        self.export_ids = {key: hid for key, hid in self.export_ids.items() if hid in self.exports}

    # ---- encoding -------------------------------------------------------------------
    def encode(self, x, frame: Frame, depth: int = 0):
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
        name = record_name(t)
        if name:
            return {"$dc": name, "fields": {f.name: self.encode(getattr(x, f.name), frame, depth + 1)
                                            for f in dataclasses.fields(x) if f.init}}
        plain = self.policy.plain_copy(x)
        if plain is not None:
            return self.encode(plain, frame, depth)
        return self.export(x)

    def export(self, x) -> dict:
        """A handle for the other side on what leaves in place of `x`: the policy refuses `x` (raises), or names
        its declared wrapper (None: `x` itself). The other side's requests act on what left; a handle coming
        back is `x` again."""
        key = id(x)
        hid = self.export_ids.get(key)
        if hid is None or self.originals.get(hid) is not x:
            out = self.policy.check_export(x)
            out = x if out is None else out
            hid = self.new_id()
            self.exports[hid], self.originals[hid] = out, x
            self.export_ids[key] = hid
        kind = getattr(type(x), "__qualname__", "object")
        return {"$h": hid, "own": True, "kind": kind if isinstance(kind, str) else "object"}

    def _encode_array(self, x, frame: Frame, torch: bool) -> dict:
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

    def _encode_gen(self, g, frame: Frame) -> dict:
        key = self.gen_keys.get(id(g))
        if key is None or self.gens.get(key) is not g:
            key = f"{self.side}:{self.new_id()}"
            self.gens[key] = g
            self.gen_keys[id(g)] = key
        if key not in frame.gens:
            frame.gens.append(key)
        return {"$g": key, "state": self.gen_state_blob(g, frame)}

    def gen_state_blob(self, g, frame: Frame) -> int:
        state = bytes(g.get_state().tolist())
        state = b"\0" * 8 + state[8:]  # the seed it was made with stays with its owner
        frame.blobs.append(state)
        return len(frame.blobs) - 1

    # ---- decoding -------------------------------------------------------------------
    def decode(self, x, frame: Frame, depth: int = 0):
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
                if hid not in self.originals:
                    raise ValueError(REFUSED)
                return self.originals[hid]
            proxy = self.proxies.get(hid)
            if proxy is None:
                kind = x.get("kind")
                proxy = self.proxies[hid] = Remote(self, hid, kind if type(kind) is str else "object")
            return proxy
        if "$dc" in x:
            cls = record_type(str(x["$dc"]))
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

    def _decode_array(self, x: dict, frame: Frame):
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

    def _decode_gen(self, x: dict, frame: Frame):
        torch = _torch()
        key = str(x["$g"])
        g = self.gens.get(key)
        if g is None:
            if key.split(":")[0] == self.side:
                raise ValueError("a generator this process never gave out")
            g = self.gens[key] = torch.Generator()
            self.gen_keys[id(g)] = key
        elif key.split(":")[0] == self.side and not self.is_lent(key):
            # One of ours that no call on our stack lends now: the other side may not set its state. It gets a
            # generator of its own, in the state it sent.
            g = torch.Generator()
            data = frame.blobs[int(x["state"])]
            if len(data) != g.get_state().numel():
                raise ValueError("a generator state of the wrong size")
            g.set_state(torch.tensor(list(data), dtype=torch.uint8))
            return g
        self.set_state(g, frame.blobs[int(x["state"])])
        if key not in frame.gens:
            frame.gens.append(key)
        return g

    def is_lent(self, key: str) -> bool:
        return any(key in gens for gens in self.lent)

    def set_state(self, g, data: bytes) -> None:
        """Set a generator's state from the other side's bytes; one of ours keeps its seed."""
        torch = _torch()
        old = g.get_state()
        if len(data) != old.numel():
            raise ValueError("a generator state of the wrong size")
        new = torch.tensor(list(data), dtype=torch.uint8)
        if self.gen_keys.get(id(g), "").startswith(self.side + ":"):
            new[:8] = old[:8]  # our own generator keeps its seed
        g.set_state(new)
