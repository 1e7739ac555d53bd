"""The call machinery: two peers over a pair of pipes, each able to call the other.

The rules:

* a call is a request message (op, id, encoded args) and exactly one reply (its id, a value or an error);
  while one side waits for its reply it serves the other's requests (nested calls: the check calls the
  learner's function, which calls the model the check handed it, ...). A reply to a call never made, or a
  malformed one, breaks the channel; a broken channel stays broken;
* the ops a side answers are its `ops` table (the kernel's exec, get, bind) and, on the objects it exported,
  call, getattr of a public name, getitem, len, iter (at most MAX_ITEMS), bool and the operators; whether an
  object may be exported, which attributes may be read and which operators asked are the side's policy;
* when a call returns, what the callee did to the arrays and generators the call passed it is synced back
  into the caller's objects (a generator only while the call lends it);
* `cpu_limit` caps this process's own work: once its CPU time (`time.process_time`, every thread) passes it, the
  next call made or served raises WorkLimit, so a flood of calls is stopped by what it costs here, never by how
  many calls an honest algorithm needs; `timeout` limits each wait for the other side.
"""

from __future__ import annotations

import operator
import os
import time

from specref_grading.trust.errors import (
    CallTimeout,
    ChannelClosed,
    WorkLimit,
    error_text,
    rebuild_error,
)
from specref_grading.trust.kernel_policy import KernelPolicy
from specref_grading.trust.remote import BINARY, COMPARE, UNARY
from specref_grading.trust.values import MAX_ITEMS, REFUSED, Codec, Frame, _np, _torch, array_bytes
from specref_grading.trust.wire import recv_message, send_message


class Peer(Codec):
    """One side of the wall. `policy` decides what it exports and answers (default: the kernel's)."""

    def __init__(self, rfd: int, wfd: int, side: str, timeout: float | None = None, policy=None,
                 ops: dict | None = None):
        super().__init__(side, policy if policy is not None else KernelPolicy())
        self.rfd, self.wfd, self.timeout = rfd, wfd, timeout
        os.set_blocking(wfd, False)
        self.ops = dict(ops or {})
        self.broken: str = ""
        self.calls = 0  # calls this side made
        self.served = 0  # calls this side answered
        self.cpu_limit: float | None = None  # process CPU seconds past which a call raises WorkLimit (None: no cap)
        self.answering = 0  # calls of the other side this side is answering now (nested)
        # Calls that came back with arrays the callee changed in place (the handle called, or None), where the
        # policy records them (the trusted side: trusted.run_test reads and clears them per test and flags it).
        self.changed: list[int | None] = []
        self.peak_head = self.peak_items = self.peak_sent = 0  # the largest messages: received (bytes, items), sent

    # ---- messages -------------------------------------------------------------------
    def _send(self, header: dict, frame: Frame, deadline: float | None) -> None:
        self.peak_sent = max(self.peak_sent, frame.items)
        send_message(self.wfd, header, frame.blobs, deadline)

    def _recv(self, deadline: float | None) -> tuple[dict, Frame]:
        header, blobs, n, items = recv_message(self.rfd, deadline)
        self.peak_head, self.peak_items = max(self.peak_head, n), max(self.peak_items, items)
        return header, Frame(blobs)

    def _deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    # ---- making a call ----------------------------------------------------------------
    def request(self, op: str, *args):
        """Ask the other side to do `op`; serve its calls meanwhile; return its answer or raise its error."""
        if self.broken:
            raise ChannelClosed(self.broken)
        self.calls += 1
        self._count()
        rid = self.new_id()
        frame = Frame()
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
                if msg.get("back") and self.policy.flags_changes:
                    # The callee changed in place an array this side passed it: a check's input, or the course's
                    # own tensor handed on by code the submission called.
                    self.changed.append(args[0] if args and type(args[0]) is int else None)
                if "err" in msg:
                    name, text = msg["err"]
                    error = rebuild_error(str(name), str(text))
                else:
                    return self.decode(msg.get("ok"), rframe)
            except (ValueError, KeyError, TypeError, IndexError, RecursionError):
                self.broken = "the other process sent a malformed answer"
                raise ChannelClosed(self.broken) from None
        finally:
            self.lent.pop()
        raise error

    def _sync_back(self, msg: dict, rframe: Frame, frame: Frame) -> None:
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
            if g is not None and self.is_lent(str(key)):  # only a generator a call on our stack lent it
                self.set_state(g, rframe.blobs[int(blob)])

    def _count(self) -> None:
        if self.cpu_limit is not None and time.process_time() > self.cpu_limit:
            self.broken = self.broken or "the cap on this process's CPU time was reached"
            raise WorkLimit(self.broken)

    # ---- answering a call -------------------------------------------------------------
    def _serve(self, msg: dict, frame: Frame) -> None:
        self.served += 1
        self._count()
        self.answering += 1
        try:
            self._answer(msg, frame)
        finally:
            self.answering -= 1

    def _answer(self, msg: dict, frame: Frame) -> None:
        rid = msg.get("id")
        out = Frame()
        reply: dict = {"re": rid}
        n_in = 0
        try:
            args = [self.decode(a, frame) for a in msg.get("args", [])]
            n_in = len(frame.arrays)
            value = self._do(str(msg.get("op")), args)
            reply["ok"] = self.encode(value, out)
        except (ChannelClosed, CallTimeout, WorkLimit):  # the wall's own failures end the test, never cross
            raise
        except BaseException as e:  # noqa: BLE001 - the caller gets the error, whatever it is
            reply = {"re": rid, "err": [type(e).__name__, error_text(e)]}
            out = Frame()
        back = []
        for i in range(min(n_in, len(frame.arrays))):
            try:
                data = array_bytes(frame.arrays[i])
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
                gens.append([key, self.gen_state_blob(g, out)])
        reply["gens"] = gens
        self._send(reply, out, self._deadline())

    def _do(self, op: str, args: list):
        if op in self.ops:
            return self.ops[op](*args)
        if not args or type(args[0]) is not int or args[0] not in self.exports:
            raise ValueError(f"{op}: {REFUSED}")
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
            self.policy.check_getattr(obj, name)
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
            name, other, reflected = args[1], args[2], args[3]
            if name in ("float", "int", "index"):
                return {"float": float, "int": int, "index": operator.index}[name](obj)
            if name not in BINARY + COMPARE + UNARY:
                raise TypeError(f"unsupported operation {name!r}")
            fn = getattr(operator, name)
            if name in UNARY:
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
