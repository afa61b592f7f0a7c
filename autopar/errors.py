"""autopar's two error channels.

- `InputError`: the user can fix it; the message names the input and the fix (CLI exit code 2).
- `Infeasible`: the inputs are fine but no plan satisfies the rules; carries the conflicting rule names and the
  nearest plan's memory shortfall when known (CLI exit code 1).
"""

from __future__ import annotations

from costmodels.errors import InputError, rebuilt_error

__all__ = ["InputError", "Infeasible"]


class Infeasible(Exception):
    """No plan fits. `rules`: names of the rules that conflict; `details`: human-readable lines of explanation."""

    def __init__(self, message: str, rules: tuple[str, ...] = (), details: tuple[str, ...] = ()) -> None:
        self.message = message
        self.rules = tuple(rules)
        self.details = tuple(details)
        super().__init__(message)

    def __reduce__(self):
        """Pickled as its class, args and attributes (a search worker process hands its errors back pickled)."""
        return rebuilt_error, (type(self), self.args, dict(self.__dict__))
