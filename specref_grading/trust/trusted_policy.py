"""The trusted side's policy: what the checks' process hands to the learner's code, and what it asks of it.

The rules:

* exports: every object leaves as its declared wrapper (exports.py: one table, type -> wrapper; an undeclared type
  is a TypeError naming it). What the exercise serves by name leaves as a `Served` call: no arguments, computed once (`serve`);
* attributes: only those a wrapper declares (exports.readable); private names never;
* operators: the checks' own code may not let an object of the submission answer an operator or its own truth
  (its answer would come from the kernel, which can say anything: an object whose __sub__ gives 0 passes
  `abs(got - want) < tol`). Only what copies plain data stays: len, iteration, indexing, float(), int(),
  index(). While this side answers a call of the kernel (the course's code the submission called), what that
  code computes goes back to the submission, which could have computed it itself: there operators are asked;
* changes: a call whose callee changed an array in place is recorded (`Peer.changed`) for the test's flags.
"""

from __future__ import annotations

from specref_grading.trust.exports import Declared, Served, declare, readable


class TrustedPolicy:
    """The checks' process's side of the wall (trusted.py)."""

    flags_changes = True

    def serve(self, table: dict[str, object]) -> dict[str, Served]:
        """The declared wrappers of what the exercise gives the kernel on purpose (the setup's served names): one
        call without arguments per name, computed once, the only form in which those objects leave this process."""
        return {name: Served(value, name) for name, value in table.items()}

    def plain_copy(self, x):
        """Nothing is sent as a copy that is not plain already."""
        return None

    def check_export(self, x) -> Declared:
        """The declared wrapper that leaves in place of `x` (TypeError if `x` is of no declared kind)."""
        return declare(x)

    def check_getattr(self, obj, name: str) -> None:
        if not readable(obj, name):
            raise AttributeError(f"{name!r} is not readable on what the grader passed: only what its kind declares")

    def check_operator(self, peer, remote, what: str) -> None:
        if not peer.answering:
            raise TypeError(f"the checks cannot use {what} of a value of the submission's own type "
                            f"({remote._kind}): return plain data (numbers, strings, lists, dicts, tensors, arrays)")
