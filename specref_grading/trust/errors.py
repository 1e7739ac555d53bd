"""What goes wrong across the wall, and how an error crosses it.

The rule: an error raised on one side reaches the other as (type name, message) only. A builtin exception
type is rebuilt as itself; any other type arrives as `RemoteError` carrying its name, so no class of the
other side is ever looked up or instantiated here. The wall's own failures are BaseExceptions, so no
`except Exception` of a check or an answer can swallow them.
"""

from __future__ import annotations

import builtins
import traceback

MAX_ERROR_TEXT = 20000  # characters of an error message that cross


class ChannelClosed(BaseException):
    """The other process is gone or broke the protocol (a BaseException: no check's `except Exception` eats it)."""


class CallTimeout(BaseException):
    """The other process did not answer within the per-call time limit."""


class MessageRefused(ChannelClosed):
    """The other process sent a message past this side's limits (bytes, items): the channel is broken."""


class WorkLimit(BaseException):
    """This side's CPU time passed `Peer.cpu_limit` (the trusted side's cap on its own work per test cell)."""


class RemoteError(Exception):
    """An exception raised on the other side whose type is not a builtin one."""


BUILTIN_ERRORS = {n: getattr(builtins, n) for n in dir(builtins)
                  if isinstance(getattr(builtins, n), type) and issubclass(getattr(builtins, n), Exception)
                  and n not in ("StopIteration", "StopAsyncIteration", "GeneratorExit")}


def error_text(e: BaseException) -> str:
    """An exception's message, read without running its own __str__, cut at MAX_ERROR_TEXT characters."""
    try:
        s = BaseException.__str__(e)
    except Exception:  # noqa: BLE001
        s = "<message could not be read>"
    return s if len(s) <= MAX_ERROR_TEXT else s[:MAX_ERROR_TEXT] + " [...]"


def describe_error(e: BaseException, filename: str) -> str:
    """'TypeName (line N): message', N the last line of the traceback in `filename` (a cell's source)."""
    if isinstance(e, SyntaxError):
        return f"SyntaxError (line {e.lineno}): {e.msg}"
    where = ""
    try:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == filename]
        if frames:
            where = f" (line {frames[-1].lineno})"
    except Exception:  # noqa: BLE001
        pass
    return f"{type(e).__name__}{where}: {error_text(e)}"


def rebuild_error(name: str, text: str) -> Exception:
    """The exception the other side reported: the builtin type of that name, else a RemoteError naming it."""
    cls = BUILTIN_ERRORS.get(name)
    if cls is not None:
        try:
            return cls(text)
        except Exception:  # noqa: BLE001
            pass
    return RemoteError(f"{name}: {text}")
