"""The user-facing error channel of the cost models.

`InputError` is raised for anything the user can fix: the message names the input and what to do, on one line.
`autopar.errors` re-exports it beside `Infeasible`; `assert` is kept for internal invariants only.
"""

from __future__ import annotations


class InputError(ValueError):
    """A bad input: the message names the input (`field`) and the fix."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")

    def __reduce__(self):
        """Pickled as its class, args and attributes (a search worker process hands its errors back pickled), so a
        subclass with other constructor arguments comes back whole too."""
        return rebuilt_error, (type(self), self.args, dict(self.__dict__))


def rebuilt_error(cls: type, args: tuple, state: dict) -> BaseException:
    """An exception of `cls` with `args` and attributes `state`, without calling its constructor (unpickling)."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


def require(condition: bool, field: str, message: str) -> None:
    """Raise `InputError(field, message)` unless `condition` holds."""
    if not condition:
        raise InputError(field, message)


def require_positive_int(value: object, field: str) -> None:
    """Positive integers only (bools are refused even though they are ints)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(field, f"must be a positive integer, got {value!r}")


def require_non_negative_int(value: object, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(field, f"must be a non-negative integer, got {value!r}")
