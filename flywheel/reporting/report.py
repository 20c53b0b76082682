"""The run report: per-round gains as markdown and a PNG plot, beside summary.json.

Reads the summary dict that HeldOutEval writes (`base_eval_pass1`, `rounds` with round,
epoch, eval_pass1, eval_passk, k, hard_set_size, cached, generated_tokens, wall_seconds and,
from callbacks.wall_time, the round's own `wall_split`):
the paper's Table 6 analogue (hard-set size and cached solutions per round) next to the
held-out gains; the round's share of generated tokens spent in trees (`tree_token_fraction`,
data_modules.token_split); with the ReST-MCTS* value model, its held-out AUC per round (`prm_auc`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flywheel.io import atomic_write_bytes


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def report_markdown(summary: dict[str, Any], title: str = "flywheel run") -> str:
    k = summary.get("k")
    base1, basek = summary.get("base_eval_pass1"), summary.get("base_eval_passk")
    rows = summary.get("rounds", [])
    auc = any("prm_auc" in r for r in rows)  # the ReST-MCTS* value model's column
    split = any("tree_token_fraction" in r for r in rows)  # the token split's (summaries from before it lack it)
    lines = [
        f"# {title}",
        "",
        f"Held-out: {summary.get('eval_problems', '?')} problems x {summary.get('samples', '?')} samples at "
        f"temperature {summary.get('temperature', '?')}; pass@k is the unbiased estimator. Round wall: the round's "
        "own seconds (its wall split, `wall_split.wall_s`); run wall: the run's wall time at the round's end, over "
        "every part of a resumed run.",
        "",
        f"| round | epoch | pass@1 | pass@{k} | hard set | cached | generated tokens | round wall (s) | run wall (s) |"
        + (" tree tokens |" if split else "") + (" value-model AUC |" if auc else ""),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if split else "") + ("---:|" if auc else ""),
    ]
    if base1 is not None:
        lines.append(f"| base | - | {base1:.4f} | {_cell(basek, '.4f')} | - | - | 0 | - | - |" + (" - |" if split else "")
                     + (" - |" if auc else ""))
    for r in rows:
        lines.append(
            f"| {r['round']} | {r['epoch']} | {_cell(r.get('eval_pass1'), '.4f')} | {_cell(r.get('eval_passk'), '.4f')} | "
            f"{_cell(r.get('hard_set_size'), 'd')} | {_cell(r.get('cached'), 'd')} | {_cell(r.get('generated_tokens'), ',d')} | "
            f"{_cell((r.get('wall_split') or {}).get('wall_s'), '.0f')} | {_cell(r.get('wall_seconds'), '.0f')} |"
            + (f" {_cell(r.get('tree_token_fraction'), '.0%')} |" if split else "")
            + (f" {_cell(r.get('prm_auc'), '.3f')} |" if auc else "")
        )
    if base1 is not None and rows and rows[-1].get("eval_pass1") is not None:
        last = rows[-1]["eval_pass1"]
        best = max(rows, key=lambda r: r.get("eval_pass1") or float("-inf"))
        lines += ["", f"pass@1 {base1:.4f} -> {last:.4f} ({last - base1:+.4f}) after round {rows[-1]['round']}; "
                      f"best {best['eval_pass1']:.4f} after round {best['round']}."]
    return "\n".join(lines) + "\n"


def report_png(summary: dict[str, Any], title: str = "flywheel run") -> bytes:
    """`report_figure` as PNG bytes."""
    import io

    buffer = io.BytesIO()
    report_figure(summary, title).savefig(buffer, format="png")
    return buffer.getvalue()


def report_figure(summary: dict[str, Any], title: str = "flywheel run"):
    """Two panels: held-out pass@1 / pass@k against generated tokens; hard set and cached per
    round (`curriculum_panel`)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    rows = summary.get("rounds", [])
    k = summary.get("k")
    tokens = [0] + [r.get("generated_tokens") or 0 for r in rows]
    pass1 = [summary.get("base_eval_pass1")] + [r.get("eval_pass1") for r in rows]
    passk = [summary.get("base_eval_passk")] + [r.get("eval_passk") for r in rows]
    fig = Figure(figsize=(10, 4), dpi=100)
    left, right = fig.subplots(1, 2)
    for values, label in ((pass1, "pass@1"), (passk, f"pass@{k}")):
        points = [(t, v) for t, v in zip(tokens, values) if v is not None]
        if points:
            left.plot(*zip(*points), marker="o", label=label)
    left.set_xlabel("generated training tokens")
    left.set_ylabel("held-out")
    left.set_title("held-out pass@k per round (first point: base)")
    left.grid(alpha=0.3)
    left.legend()
    curriculum_panel(right, rows)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def curriculum_panel(axes, rows: list[dict[str, Any]]) -> None:
    """The hard set and the cached solutions per round as bars on `axes`; with neither (the hard
    set off and nothing cached: only bars of height 0, on a -0.04..0.04 axis) a line saying so."""
    rounds = [r["round"] for r in rows]
    hard = [r.get("hard_set_size") for r in rows]
    cached = [r.get("cached") for r in rows]
    if all(v is None for v in hard) and not any(cached):
        axes.set_axis_off()
        axes.text(0.5, 0.5, "the hard set is off and nothing was cached\n(--data.hard_set.*, --data.replay.*)",
                  ha="center", va="center", transform=axes.transAxes)
        return
    if all(v is not None for v in hard):
        axes.bar([x - 0.2 for x in rounds], hard, width=0.4, label="hard set")
    if all(v is not None for v in cached):
        axes.bar([x + 0.2 for x in rounds], cached, width=0.4, label="cached solutions")
    axes.set_xticks(rounds)  # whole rounds, not 0.6 ... 1.4
    axes.set_xlabel("round")
    axes.set_title("hard set and replay buffer per round" if any(v is not None for v in hard) else
                   "replay buffer per round (the hard set is off)")
    axes.grid(alpha=0.3, axis="y")
    axes.legend()


def write_run_report(summary: dict[str, Any], folder: str | Path, title: str = "flywheel run") -> tuple[Path, Path]:
    """Write report.md and report.png into `folder` (atomically); return their paths."""
    folder = Path(folder)
    md, png = folder / "report.md", folder / "report.png"
    atomic_write_bytes(md, report_markdown(summary, title).encode())
    atomic_write_bytes(png, report_png(summary, title))
    return md, png


def summary_file(path: str | Path) -> Path:
    """The summary.json of `path`: the file itself, the one in the folder, or else the newest
    one below it (a run folder holding version_0/, version_1/, ...). FileNotFoundError names
    the folder."""
    path = Path(path)
    if path.is_file():
        return path
    if (path / "summary.json").is_file():
        return path / "summary.json"
    found = sorted(path.rglob("summary.json"), key=lambda p: p.stat().st_mtime) if path.is_dir() else []
    if found:
        return found[-1]
    if path.is_dir() and is_run_folder(path):
        raise FileNotFoundError(f"{path}: no round has finished yet (a run writes summary.json after its base "
                                "evaluation and at every round's end); report again once one has")
    raise FileNotFoundError(f"{path}: no summary.json in it or below it; give a run's log folder "
                            "(e.g. runs/quickstart/version_0), where `flywheel fit` writes summary.json")


RUN_FILES = ("config.yaml", "hparams.yaml", "events.out.tfevents.*", "checkpoints")
"""What a fit leaves in its log folder (or run root) before its first round ends."""


def is_run_folder(path: Path) -> bool:
    """Whether `path` is a run's log folder (runs/quickstart/version_0) or its root (runs/quickstart)."""
    return any(next(folder.glob(pattern), None) for folder in (path, *path.glob("version_*")) for pattern in RUN_FILES)


def main(args: list[str]) -> tuple[Path, Path]:
    """`python -m flywheel report RUN_DIR`: report.md and report.png from a run's summary.json
    (a fit writes them at every round's end too; this redraws them, e.g. for a copied folder)."""
    import json

    from flywheel.run.errors import PreflightError
    from flywheel.run.flags import StrictParser

    parser = StrictParser(prog="python -m flywheel report", description=main.__doc__)
    parser.add_argument("run_dir", help="a run's log folder (or its summary.json)")
    ns = parser.parse_args(args)
    try:
        source = summary_file(ns.run_dir)
        summary = json.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise PreflightError(str(err)) from None
    except (OSError, ValueError) as err:
        raise PreflightError(f"{ns.run_dir}: summary.json cannot be read ({err}); it is damaged or not a run's") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("rounds"), list):
        raise PreflightError(f"{source}: not a run summary of `flywheel fit` (no rounds)")
    if not summary["rounds"]:
        raise PreflightError(f"{source}: no round has finished yet (held-out pass@1 before training: "
                             f"{_cell(summary.get('base_eval_pass1'), '.4f')}); report again once one has")
    md, png = write_run_report(summary, source.parent, title=source.parent.parent.name)
    print(f"written: {md}, {png}")
    return md, png
