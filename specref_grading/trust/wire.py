"""The wire format: one message is a 4-byte length, a JSON header, then raw byte blobs. Nothing is pickled.

The rule: a receiver checks a message against its limits on the raw bytes, before parsing anything. The
length prefix is refused past `MAX_HEADER`; the header's values (its commas, brackets and braces outside
strings: `json_items`) are counted on the bytes and refused past `MAX_MESSAGE_ITEMS`, so a reply of a million
tiny lists costs the receiver a scan of its bytes, never the million lists; the blobs' sizes are checked
against `MAX_MESSAGE` before they are read. Any violation breaks the channel (`MessageRefused`,
`ChannelClosed`). The limits are orders of magnitude above what an honest grading sends and leave room for
learners' lists of many thousands of values. Tensors and arrays travel as blobs (values.py).
"""

from __future__ import annotations

import json
import os
import re
import select
import struct
import time

from specref_grading.trust.errors import CallTimeout, ChannelClosed, MessageRefused

MAX_MESSAGE = 1 << 28  # bytes of one message (header and blobs); a longer one breaks the channel
MAX_HEADER = 1 << 26  # bytes of one message's JSON header
MAX_MESSAGE_ITEMS = 1 << 18  # values and containers of one header, counted across all its nested containers
_JSON_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')


def json_items(head: bytes) -> int:
    """An upper bound on the values in a JSON text (its commas, brackets and braces outside strings, plus one),
    read from its bytes without parsing them."""
    bare = _JSON_STRINGS.sub(b'""', head) if b'"' in head else head
    return bare.count(b",") + bare.count(b"[") + bare.count(b"{") + 1


def write_all(fd: int, data: bytes, deadline: float | None) -> None:
    """Write `data` to a non-blocking fd by `deadline` (CallTimeout), or ChannelClosed if the fd is gone."""
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


def read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    """Read exactly `n` bytes by `deadline` (CallTimeout), or ChannelClosed at end of file."""
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


def send_message(fd: int, header: dict, blobs: list[bytes], deadline: float | None) -> None:
    """Send one message: `header` (plain JSON; its "blobs" entry is set here to the blobs' sizes) and `blobs`."""
    header["blobs"] = [len(b) for b in blobs]
    head = json.dumps(header, ensure_ascii=True, allow_nan=False).encode("ascii")
    if len(head) + sum(header["blobs"]) > MAX_MESSAGE:
        raise ValueError("a value too large to be passed between processes")
    # One write per message where it is small: every write wakes the reader, which costs on a busy machine.
    write_all(fd, b"".join([struct.pack(">I", len(head)), head, *blobs]), deadline)


def recv_message(fd: int, deadline: float | None) -> tuple[dict, list[bytes], int, int]:
    """Receive one message within the limits: (header, blobs, header bytes, header items)."""
    (n,) = struct.unpack(">I", read_exact(fd, 4, deadline))
    if n > MAX_MESSAGE or n > MAX_HEADER:
        raise MessageRefused(f"a message of more than {min(MAX_MESSAGE, MAX_HEADER) >> 20} MB of plain values "
                             f"({n >> 20} MB)")
    head = read_exact(fd, n, deadline)
    items = json_items(head)
    if items > MAX_MESSAGE_ITEMS:
        raise MessageRefused(f"a message of more than {MAX_MESSAGE_ITEMS} values (about {items}, counted across "
                             "its nested lists, tuples, dicts and sets)")
    try:
        header = json.loads(head)
        sizes = header["blobs"]
        if type(sizes) is not list or any(type(s) is not int or s < 0 for s in sizes) or sum(sizes) + n > MAX_MESSAGE:
            raise ValueError
    except (ValueError, KeyError, TypeError, RecursionError):
        raise ChannelClosed("the other process sent a malformed message") from None
    return header, [read_exact(fd, s, deadline) for s in sizes], n, items
