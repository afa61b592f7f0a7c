"""The frameworks autopar writes launch configs for, and the names users may call them by."""

from __future__ import annotations

from costmodels.errors import InputError

FRAMEWORKS: tuple[str, ...] = ("megatron", "nemo", "bridge", "verl", "torchtitan", "deepspeed")
ALIASES = {"megatron-lm": "megatron", "nemo2": "nemo", "megatron-bridge": "bridge", "titan": "torchtitan",
           "ds": "deepspeed"}


def framework_name(name: str, field: str = "emit") -> str:
    """The canonical framework name for `name` (case-insensitive, aliases accepted), or InputError."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in FRAMEWORKS:
        raise InputError(field, f"unknown framework {name!r}; use one of {', '.join(FRAMEWORKS)}")
    return key
