"""``diffsweep model ...``: sizes, FLOPs and shapes of the model zoo."""

from __future__ import annotations

from typing import Annotated

import typer

from diffsweep.cli.common import (
    ArchOpt,
    ConfigArg,
    JsonOpt,
    SetOpt,
    SizeOpt,
    cli_config,
    handle_errors,
    print_json,
)
from diffsweep.config.kinds import kind_names

app = typer.Typer(help="Inspect model sizes, FLOPs and head layouts without training.", no_args_is_help=True)

CheckOpt = Annotated[
    bool, typer.Option("--check", help="Also build the model on PyTorch's meta device and confirm the counts.")
]


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3f}{unit}"
    return str(n)


def _check_counts(cfg) -> dict[str, int]:
    from diffsweep.model.transformer import count_on_meta  # imports torch

    return {"meta_params": count_on_meta(cfg.model)}


@app.command()
@handle_errors
def info(config: ConfigArg = None, size: SizeOpt = None, arch: ArchOpt = None, set_: SetOpt = None,
         json_: JsonOpt = False, check: CheckOpt = False) -> None:
    """Parameters, FLOPs/token, the layer/head shape table and λ_init per layer of one model."""
    from diffsweep.model.summary import describe

    cfg = cli_config(config, size, arch, set_)
    data = describe(cfg)
    if check:
        data.update(_check_counts(cfg))
    if json_:
        print_json(data)
        return
    _render_info(data)


def _render_info(data: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    a = data["attention"]
    title = f"{data['arch']}" + (f" @ {data['size']}" if data["size"] else "")
    if data["overrides_of_size"]:
        title += f" (overridden: {', '.join(k.rsplit('.', 1)[-1] for k in data['overrides_of_size'])})"
    t = Table(title=title, show_header=False)
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_row("parameters", f"{data['params']:,} ({_human(data['params'])})")
    t.add_row("non-embedding", f"{data['non_embedding_params']:,} ({_human(data['non_embedding_params'])})")
    t.add_row("embedding", f"{data['embedding_params']:,}")
    t.add_row("attention", f"{data['attention_params']:,}")
    t.add_row(f"FLOPs/token fwd (T={data['seq_len']})", f"{data['forward_flops_per_token']:,}")
    t.add_row(f"FLOPs/token train (T={data['seq_len']})", f"{data['train_flops_per_token']:,}")
    if "meta_params" in data:
        t.add_row("meta-device check", f"{data['meta_params']:,} ✓")
    console.print(t)

    m = data["model"]
    s = Table(title="layer / head shapes", show_header=False)
    s.add_column(style="bold")
    s.add_column(justify="right")
    rows = {
        "layers": m["n_layers"], "d_model": m["d_model"], "FFN hidden (SwiGLU)": m["ffn_hidden"],
        "vocab (tied)" if m["tie_embeddings"] else "vocab (untied)": m["vocab_size"],
        "heads": a["heads"], "KV heads / groups": a["kv_heads"], "GQA group size": a["gqa_group_size"],
        "query (sub)heads per call": a["query_heads"], "key (sub)heads": a["key_heads"],
        "QK head dim": a["qk_dim"], "V head dim": a["v_dim"], "per-head norm": a["head_norm"],
    }
    for key in ("output_scale", "pairing", "lambda"):
        if key in a:
            rows[f"{key.replace('_', ' ')}"] = a[key]
    for key, value in rows.items():
        s.add_row(key, str(value))
    console.print(s)
    w = Table(title="attention weights per layer")
    w.add_column("parameter")
    w.add_column("shape", justify="right")
    for name, shape in a["weights"].items():
        w.add_row(name, " x ".join(map(str, shape)))
    console.print(w)
    if "lambda_init" in data:
        lam = data["lambda_init"]
        lt = Table(title=f"λ_init per layer ({lam['strategy']})")
        lt.add_column("layer", justify="right")
        lt.add_column("λ_init", justify="right")
        for i, v in enumerate(lam["per_layer"], start=1):
            lt.add_row(str(i), f"{v:.4f}")
        console.print(lt)


@app.command()
@handle_errors
def compare(config: ConfigArg = None, size: SizeOpt = None, set_: SetOpt = None, json_: JsonOpt = False,
            check: CheckOpt = False) -> None:
    """The three architectures side by side, with parameter and FLOP mismatch vs the Transformer."""
    from diffsweep.model.summary import compare as compare_configs

    # Each kind is loaded from the same inputs, so derived fields (head counts, per-head norm)
    # are derived per kind unless the user pinned them; the kind itself is forced last.
    configs = {
        kind: cli_config(config, size, None, [*(set_ or []), f"model.attention.kind={kind}"])
        for kind in kind_names()
    }
    data = compare_configs(configs)
    if check:
        for name, cfg in configs.items():
            data["rows"][name].update(_check_counts(cfg))
    if json_:
        print_json(data)
        return
    _render_compare(data)


def _render_compare(data: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    rows = data["rows"]
    t = Table(title=f"architectures side by side (Δ vs {data['baseline']})")
    t.add_column("")
    for name in rows:
        t.add_column(name, justify="right")

    def line(label, fn):
        t.add_row(label, *(fn(r) for r in rows.values()))

    line("heads", lambda r: str(r["attention"]["heads"]))
    line("query heads per call", lambda r: str(r["attention"]["query_heads"]))
    line("KV heads / groups", lambda r: str(r["attention"]["kv_heads"]))
    line("QK / V head dim", lambda r: f"{r['attention']['qk_dim']} / {r['attention']['v_dim']}")
    line("parameters", lambda r: f"{r['params']:,}")
    line("Δ parameters", lambda r: f"{r['params_vs_baseline_pct']:+.3f}%")
    line("non-embedding", lambda r: f"{r['non_embedding_params']:,}")
    line("Δ non-embedding", lambda r: f"{r['non_embedding_params_vs_baseline_pct']:+.3f}%")
    line(f"train FLOPs/token (T={next(iter(rows.values()))['seq_len']})", lambda r: f"{r['train_flops_per_token']:,}")
    line("Δ FLOPs", lambda r: f"{r['train_flops_per_token_vs_baseline_pct']:+.3f}%")
    line("FFN hidden (for param parity)", lambda r: f"{r['model']['ffn_hidden']} ({r['parity_ffn_hidden']})")
    if all("meta_params" in r for r in rows.values()):
        line("meta-device check", lambda r: "✓")
    Console().print(t)


@app.command()
def sizes(json_: JsonOpt = False) -> None:
    """List the size presets (paper Table 9, the 3B of Table 8, and tiny CPU presets)."""
    from diffsweep.model.summary import size_table

    rows = size_table()
    if json_:
        print_json(rows)
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title="size presets")
    for col in ("size", "d_model", "layers", "head dim", "ffn", "vocab", "seq", "params (tf)"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["size"], str(r["d_model"]), str(r["n_layers"]), str(r["head_dim"]), str(r["ffn_hidden"]),
                  str(r["vocab_size"]), str(r["seq_len"]), _human(r["transformer_params"]))
    Console().print(t)

