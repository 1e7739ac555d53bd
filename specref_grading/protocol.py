"""The names of the grading wall's protocol, for the modules and tests that import them from here.

The protocol itself lives in the trusted core, specref_grading/trust/ (docs/grading-threat-model.md): the wire
format (wire.py), the values that cross (values.py, records.py), the handles on the other side's objects
(remote.py), the call machinery (calls.py), each side's policy (kernel_policy.py, trusted_policy.py) and the
kernel's program made of them (program.py). This module defines nothing.
"""

from __future__ import annotations

from specref_grading.trust.calls import Peer
from specref_grading.trust.errors import (
    CallLimit,
    CallTimeout,
    ChannelClosed,
    MessageRefused,
    RemoteError,
    describe_error,
    error_text,
)
from specref_grading.trust.kernel_policy import KernelPolicy
from specref_grading.trust.program import kernel_program
from specref_grading.trust.remote import Remote
from specref_grading.trust.trusted_policy import TrustedPolicy
from specref_grading.trust.values import MAX_DEPTH, MAX_ITEMS, Frame
from specref_grading.trust.wire import MAX_HEADER, MAX_MESSAGE, MAX_MESSAGE_ITEMS, json_items

__all__ = ["MAX_DEPTH", "MAX_HEADER", "MAX_ITEMS", "MAX_MESSAGE", "MAX_MESSAGE_ITEMS", "CallLimit", "CallTimeout",
           "ChannelClosed", "Frame", "KernelPolicy", "MessageRefused", "Peer", "Remote", "RemoteError",
           "TrustedPolicy", "describe_error", "error_text", "json_items", "kernel_program"]
