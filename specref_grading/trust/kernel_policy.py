"""The kernel's policy: what the learner's side of the wall exports and answers.

The kernel holds nothing the grade depends on, so it exports every object it is asked for and answers every
public attribute and operator. One rule protects the checks: an instance of a subclass of a plain type (int,
float, str, bool, tuple, list, dict, set, frozenset) is sent as a plain copy of the base type, so a learner's
int whose __eq__ lies arrives as an int, never as a handle the checks would have to ask.
"""

from __future__ import annotations

_PLAIN_TYPES = (bool, int, float, str, tuple, list, dict, set, frozenset)


class KernelPolicy:
    """The jailed kernel's side (jail.py's program): everything out, plain subclasses as plain copies."""

    flags_changes = False  # the kernel does not judge what the trusted side's calls change

    def plain_copy(self, x):
        """A plain copy of an instance of a plain type's subclass, else None."""
        for base in _PLAIN_TYPES:
            if isinstance(x, base):
                return base(x) if base not in (int, float, str) else base.__new__(base, x)
        return None

    def check_export(self, x) -> None:
        """Every object may be handed to the trusted side."""

    def check_getattr(self, obj, name: str) -> None:
        """Every public attribute may be read."""

    def check_operator(self, peer, remote, what: str) -> None:
        """The kernel may ask an operator of the trusted side's objects."""
