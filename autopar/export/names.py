"""The frameworks autopar writes launch configs for, and the names users may call them by."""

from __future__ import annotations

from costmodels.errors import InputError

FRAMEWORKS: tuple[str, ...] = ("megatron", "nemo", "bridge", "verl", "torchtitan", "deepspeed")
ALIASES = {"megatron-lm": "megatron", "nemo2": "nemo", "megatron-bridge": "bridge", "titan": "torchtitan",
           "ds": "deepspeed"}


PRICED_ONLY: tuple[str, ...] = ("pytorch", "llmc")
"""Frameworks whose step autopar prices (--framework) but writes no launch config for: a plain PyTorch training
loop, and llm.c (a CUDA-C trainer)."""
PRICED_ALIASES = {"torch": "pytorch", "plain-pytorch": "pytorch", "llm.c": "llmc", "native": "llmc"}

ENGINE_OF_FRAMEWORK: dict[str, str] = {"megatron": "megatron", "nemo": "megatron", "bridge": "megatron",
                                       "verl": "megatron", "torchtitan": "torchtitan", "deepspeed": "deepspeed",
                                       "pytorch": "pytorch", "llmc": "native"}
"""The engine (costmodels.specs.Engine) that runs each framework's step: NeMo 2, Megatron-Bridge and verl's Megatron
backend all run Megatron-Core with Transformer Engine."""


def framework_name(name: str, field: str = "emit") -> str:
    """The canonical framework name for `name` (case-insensitive, aliases accepted), or InputError. `--framework`
    (field 'framework') also takes the frameworks autopar prices but writes no config for (PRICED_ONLY)."""
    key = name.strip().lower()
    key = ALIASES.get(key, PRICED_ALIASES.get(key, key) if field == "framework" else key)
    known = FRAMEWORKS + (PRICED_ONLY if field == "framework" else ())
    if key not in known:
        hint = "" if field == "framework" or key not in PRICED_ONLY else \
            f" ({key} is priced with --framework {key}, but autopar writes no launch config for it)"
        raise InputError(field, f"unknown framework {name!r}{hint}; use one of {', '.join(known)}")
    return key
