"""`autopar models`: the bundled model presets with their shapes and parameter counts.

    autopar models            # a table
    autopar models --json     # a JSON list, one object per preset

Presets load as plain JSON (no transformers import); numpy comes in with the parameter counts, inside `run`.
"""

from __future__ import annotations

import argparse
import json


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "models", help="list the bundled model presets",
        description="List the bundled model presets (Hugging Face config.json files under autopar/presets/) with "
                    "their total and active parameters (without multi-token-prediction modules), layers, hidden size, "
                    "attention heads / KV heads and experts. Any of these names is a valid MODEL argument.")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
    parser.set_defaults(run=run)


def preset_rows() -> list[dict[str, object]]:
    """One dict per bundled preset: name, model_type-independent shape and parameter counts."""
    from autopar.models import load_preset, preset_names
    from costmodels.params import active_params, total_params

    rows = []
    for name in preset_names():  # grouped by family, smallest first
        model = load_preset(name)
        moe = model.moe
        rows.append({
            "name": name,
            "total_params": total_params(model),
            "active_params": active_params(model),
            "num_layers": model.num_layers,
            "hidden_size": model.hidden_size,
            "num_attention_heads": model.num_attention_heads,
            "num_kv_heads": model.num_kv_heads,
            "attention": "mla" if model.mla is not None else ("mha" if model.num_kv_heads ==
                                                              model.num_attention_heads else "gqa"),
            "num_experts": moe.num_experts if moe else 0,
            "top_k": moe.top_k if moe else 0,
            "num_shared_experts": moe.num_shared_experts if moe else 0,
            "vocab_size": model.vocab_size,
            "tied_embeddings": model.tied_embeddings,
            "num_mtp_layers": model.num_mtp_layers,
        })
    return sorted(rows, key=lambda row: (str(row["name"]).split("-")[0], row["total_params"], row["name"]))


def _billions(count: object) -> str:
    return f"{int(count) / 1e9:.1f}B"  # type: ignore[arg-type]


def _experts(row: dict[str, object]) -> str:
    if not row["num_experts"]:
        return "-"
    shared = f"+{row['num_shared_experts']}s" if row["num_shared_experts"] else ""
    return f"{row['num_experts']}{shared} top{row['top_k']}"


def format_table(rows: list[dict[str, object]]) -> str:
    header = ("preset", "params", "active", "layers", "hidden", "heads/kv", "experts")
    lines = [(str(row["name"]), _billions(row["total_params"]), _billions(row["active_params"]),
              str(row["num_layers"]), str(row["hidden_size"]),
              f"{row['num_attention_heads']} mla" if row["attention"] == "mla"
              else f"{row['num_attention_heads']}/{row['num_kv_heads']}",
              _experts(row)) for row in rows]
    widths = [max(len(cells[i]) for cells in [header, *lines]) for i in range(len(header))]

    def render(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(cell.rjust(width) for cell, width in zip(cells[1:], widths[1:]))]).rstrip()

    footer = ("params: total without multi-token-prediction modules; active: touched by one token "
              "(routed experts counted top_k/E). Use a name as MODEL, e.g. `autopar estimate llama-3.1-70b ...`.")
    return "\n".join([render(header), *(render(cells) for cells in lines), "", footer])


def run(args: argparse.Namespace) -> int:
    rows = preset_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(format_table(rows))
    return 0
