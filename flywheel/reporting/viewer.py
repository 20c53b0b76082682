"""The tree viewer: one search tree as a self-contained HTML page.

    python -m flywheel tree runs/quickstart/version_0              # first tree of the last epoch
    python -m flywheel tree runs/quickstart/version_0 --epoch 3 --index 1 --out tree.html
    python -m flywheel tree some_tree.json

The page goes to `--out`, by default `tree_<problem id>.html` beside the input (one page per
problem shown).

Reads the trees a run saves (`<log_dir>/trees/epoch_NNNN.jsonl`, format
"flywheel.search.tree/v1", `--data.save_trees`) or a single dumped tree. Nodes are coloured
by their soft-clipped value q~ (red -1, white 0, green +1), terminals are squares outlined by
their verdict, the K backed-up trajectories are drawn in blue with their backup order, and
each expanded node carries its place in the expansion order (e1 = the root's expansion),
which shows where the frontier selection went next. Hover a node for its id (#12) and step
text; click it for every statistic and the whole text of its path from the root. A link
opens with a node shown: `tree.html#node=12` by its id, `tree.html#expansion=3` by its label.
The prompt is shown as the policy saw it (chat template and special tokens included) and
every label is explained under the tree. No network access: the page has no external resources.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import re
from pathlib import Path
from typing import Any

from flywheel.io import atomic_write_bytes
from flywheel.search.outputs import JSON_FORMAT
from flywheel.run.flags import StrictParser

X_GAP, Y_GAP, MARGIN, RADIUS = 26, 84, 40, 8
VERDICT_COLOURS = {"correct": "#1a9850", "incorrect": "#d73027", "incomplete": "#7f7f7f"}
TRAJECTORY_COLOUR = "#2166ac"

log = logging.getLogger(__name__)


def value_colour(value: float | None) -> str:
    """-1 -> red, 0 -> white, +1 -> green (linear in between); None -> light grey."""
    if value is None:
        return "#dddddd"
    v = max(-1.0, min(1.0, value))
    low, mid, high = (215, 48, 39), (247, 247, 247), (26, 152, 80)
    end = high if v >= 0 else low
    t = abs(v)
    rgb = [round(m + (e - m) * t) for m, e in zip(mid, end)]
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def expansion_order(nodes: list[dict[str, Any]]) -> dict[int, int]:
    """Expanded node id -> its place (1-based) in the order of expansions.

    Node ids are creation order and a node's children are created when it is expanded, so
    sorting expanded nodes by their first child's id recovers the order the search chose."""
    expanded = sorted((min(n["children"]), n["id"]) for n in nodes if n["children"])
    return {node: i + 1 for i, (_, node) in enumerate(expanded)}


def layout(nodes: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """Tidy enough: leaves left to right in depth-first order, parents centred over children."""
    by_id = {n["id"]: n for n in nodes}
    pos: dict[int, tuple[float, float]] = {}
    next_x = [0]

    def place(node_id: int) -> float:  # iterative would be longer; trees are shallow
        node = by_id[node_id]
        if not node["children"]:
            x = next_x[0]
            next_x[0] += 1
        else:
            xs = [place(child) for child in node["children"]]
            x = (xs[0] + xs[-1]) / 2
        pos[node_id] = (MARGIN + x * X_GAP, MARGIN + node["depth"] * Y_GAP)
        return x

    place(0)
    return pos


def render_tree_html(tree: dict[str, Any], title: str | None = None) -> str:
    """The whole page for one tree dump (format flywheel.search.tree/v1)."""
    if tree.get("format") != JSON_FORMAT:
        raise ValueError(f"not a search tree dump: format {tree.get('format')!r}, expected {JSON_FORMAT!r}")
    nodes = tree["nodes"]
    pos = layout(nodes)
    order = expansion_order(nodes)
    on_path: dict[int, list[int]] = {}
    for t in tree["trajectories"]:
        for node_id in [0, *t["node_ids"]]:
            on_path.setdefault(node_id, []).append(t["backup_index"])
    width = max(x for x, _ in pos.values()) + 2 * MARGIN + 200
    height = max(y for _, y in pos.values()) + 2 * MARGIN
    edges, shapes = [], []
    for n in nodes:
        if n["parent"] is None:
            continue
        (x1, y1), (x2, y2) = pos[n["parent"]], pos[n["id"]]
        traj = n["id"] in on_path
        edges.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{TRAJECTORY_COLOUR if traj else "#bbbbbb"}" stroke-width="{3 if traj else 1}"/>'
        )
    for n in nodes:
        x, y = pos[n["id"]]
        text = n.get("text") if n["id"] else tree.get("prompt_text")
        answer = f" -> {n['turn']['observation']}" if n.get("turn") else ""  # an environment's answer to the action
        tip = html.escape(f"#{n['id']} depth {n['depth']}{expansion_label(order, n['id'])}: "
                          f"{text if text is not None else n['token_ids']}{answer}")
        fill = value_colour(n.get("q_soft"))
        attrs = f'class="node" data-id="{n["id"]}" fill="{fill}"'
        if n["terminal"]:
            stroke = VERDICT_COLOURS.get(n.get("kind") or "incomplete", "#7f7f7f")
            shape = (f'<rect {attrs} x="{x - RADIUS:.1f}" y="{y - RADIUS:.1f}" width="{2 * RADIUS}" height="{2 * RADIUS}" '
                     f'stroke="{stroke}" stroke-width="3">')
            shapes.append(f"{shape}<title>{tip}</title></rect>")
        else:
            shapes.append(f'<circle {attrs} cx="{x:.1f}" cy="{y:.1f}" r="{RADIUS}" stroke="#444" stroke-width="1">'
                          f"<title>{tip}</title></circle>")
        if n["id"] in order:
            shapes.append(f'<text class="order" x="{x + RADIUS + 2:.1f}" y="{y - RADIUS:.1f}">e{order[n["id"]]}</text>')
        if n["terminal"] and n.get("backup_index") is not None:
            shapes.append(f'<text class="k" x="{x - 6:.1f}" y="{y + RADIUS + 14:.1f}">K{n["backup_index"] + 1}</text>')
    data = json.dumps({"tree": tree, "order": order}).replace("</", "<\\/")
    heading = html.escape(title or f"problem {tree.get('problem_id')} ({tree.get('mode')}, {tree.get('status')})")
    stats = tree.get("stats", {})
    kinds = [t["kind"] for t in tree["trajectories"]]
    summary = html.escape(
        f"{stats.get('nodes', len(nodes))} nodes, {stats.get('expansions', len(order))} expansions, "
        f"{len(kinds)} trajectories ({kinds.count('correct')} correct), {stats.get('generated_tokens', '?')} generated tokens"
    )
    return _PAGE.format(
        title=heading, summary=summary, prompt=html.escape(seen_prompt(tree)), width=f"{width:.0f}",
        height=f"{height:.0f}", edges="\n".join(edges), shapes="\n".join(shapes), data=data,
        legend=_legend(), labels=_labels(),
    )


def expansion_label(order: dict[int, int], node: int) -> str:
    """`, expansion e3` for the third node expanded; "" for a node never expanded."""
    return f", expansion e{order[node]}" if node in order else ""


def seen_prompt(tree: dict[str, Any]) -> str:
    """The prompt as the policy saw it: its tokens decoded with the special tokens and the chat
    template (`prompt_seen`, written by the run), else the plain decoded text."""
    return tree.get("prompt_seen") or tree.get("prompt_text") or ""


LABELS = (
    ("q~", "the node's soft-clipped value, tanh(q / eps) x q_max: the credit its steps get (colour: red -1, white 0, "
           "green +1); a terminal's is its reward"),
    ("q", "the node's backed-up value (the constrained backup of the rewards below it); Q: the mean over its visits"),
    ("N", "how often the backups passed through the node"),
    ("PRM V", "the value model's estimate of the node (ReST-MCTS*, --prm_update); - when the run has no value model"),
    ("#n", "the node's id (its place in the order of creation; tree.html#node=n opens with it shown)"),
    ("eN", "the order in which the search expanded the node (e1 = the root, the first expansion; "
           "tree.html#expansion=N opens with it shown); - for a node never expanded"),
    ("mean NLL", "the policy's mean negative log-likelihood of the node's step tokens"),
    ("K1, K2, ...", "the terminals backed up, in backup order (blue: their paths)"),
)
"""What each label of the page means (the legend under the tree)."""


def _labels() -> str:
    return "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in LABELS)


def _legend() -> str:
    swatches = "".join(
        f'<span class="sw" style="background:{value_colour(v)}"></span>{v:+.1f} ' for v in (-1.0, -0.5, 0.0, 0.5, 1.0)
    )
    verdicts = "".join(
        f'<span class="sw sq" style="border-color:{c}"></span>{k} ' for k, c in VERDICT_COLOURS.items()
    )
    return (f"q~: {swatches} &nbsp; terminals: {verdicts} &nbsp; "
            f'<span class="sw" style="background:{TRAJECTORY_COLOUR}"></span>backed-up trajectory (K1 = first) '
            "&nbsp; eN = the N-th expansion")


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 12px; }}
#prompt {{ white-space: pre-wrap; font-family: monospace; background: #f4f4f4; padding: 4px 8px; display: inline-block; }}
#legend {{ margin: 8px 0; font-size: 13px; }}
.sw {{ display: inline-block; width: 12px; height: 12px; border: 1px solid #444; border-radius: 6px; margin: 0 3px -2px 6px; }}
.sw.sq {{ border-radius: 0; border-width: 3px; background: #fff; }}
#canvas {{ overflow: auto; border: 1px solid #ccc; max-height: 70vh; }}
.node {{ cursor: pointer; }}
.node.selected {{ stroke: #000; stroke-width: 4; }}
text.order {{ font-size: 10px; fill: #555; }}
text.k {{ font-size: 10px; fill: {trajectory}; font-weight: bold; }}
#labels {{ font-size: 13px; display: grid; grid-template-columns: max-content auto; gap: 2px 12px; }}
#labels dd {{ margin: 0; }}
#details {{ font-family: monospace; white-space: pre-wrap; background: #fafafa; border: 1px solid #ddd; padding: 8px; min-height: 3em; }}
</style></head>
<body>
<h2>{title}</h2>
<div>prompt, as the policy saw it (special tokens and chat template included): <span id="prompt">{prompt}</span></div>
<div id="summary">{summary}</div>
<div id="legend">{legend}</div>
<div id="canvas"><svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">
{edges}
{shapes}
</svg></div>
<p>Click a node for its statistics and its whole text from the root.</p>
<div id="details"></div>
<dl id="labels">{labels}</dl>
<script id="tree-data" type="application/json">{data}</script>
<script>
const payload = JSON.parse(document.getElementById("tree-data").textContent);
const nodes = new Map(payload.tree.nodes.map(n => [n.id, n]));
const prompt = payload.tree.prompt_seen || payload.tree.prompt_text || "";
const stepText = m => (m.text ?? JSON.stringify(m.token_ids)) + (m.turn ? m.turn.observation : "");  // an action and its answer
function path(n) {{  // the root first
  const out = [n];
  while (out[0].parent !== null && out[0].parent !== undefined) out.unshift(nodes.get(out[0].parent));
  return out;
}}
const fmt = v => (v === null || v === undefined) ? "-" : (typeof v === "number" ? Number(v.toFixed(4)) : v);
function show(id) {{
  const n = nodes.get(id);
  document.querySelectorAll(".node.selected").forEach(e => e.classList.remove("selected"));
  document.querySelector(`.node[data-id="${{id}}"]`).classList.add("selected");
  const lines = [
    `node #${{n.id}}  depth ${{n.depth}}  parent ${{fmt(n.parent)}}  expansion ${{n.id in payload.order ? "e" + payload.order[n.id] : "-"}}`,
    `N ${{n.visits}}  q ${{fmt(n.q)}}  Q ${{fmt(n.Q)}}  q~ ${{fmt(n.q_soft)}}  mean NLL ${{fmt(n.mean_nll)}}  PRM V ${{fmt(n.prm_value)}}`,
    n.terminal ? `terminal: ${{n.kind}}  reward ${{fmt(n.reward)}}  backup ${{n.backup_index === null ? "not backed up" : "K" + (n.backup_index + 1)}}` : `children ${{n.children.length}}`,
    n.verdict ? `verdict: ${{n.verdict.reason}}  answer ${{fmt(n.verdict.answer)}}` : "",
    n.turn ? `the environment's answer: ${{JSON.stringify(n.turn.observation)}}${{n.turn.invalid ? "  (an invalid action)" : ""}}` : "",
    "", `the path's text from the root (${{path(n).length - 1}} steps, each after a ¦):`,
    path(n).map(m => m.id === 0 ? prompt : "¦" + stepText(m)).join(""),
  ];
  document.getElementById("details").textContent = lines.filter(Boolean).join("\\n");
}}
document.querySelectorAll(".node").forEach(e => e.addEventListener("click", () => show(Number(e.dataset.id))));
// tree.html#node=12 opens with node #12 shown, tree.html#expansion=3 with the node labelled e3
const byExpansion = new Map(Object.entries(payload.order).map(([id, e]) => [e, Number(id)]));
const linked = location.hash.match(/(node|expansion)=(\\d+)/);
const target = linked && (linked[1] === "node" ? Number(linked[2]) : byExpansion.get(Number(linked[2])));
if (target !== undefined && target !== null && nodes.has(target)) show(target);
document.body.dataset.rendered = String(nodes.size);
</script>
</body></html>
""".replace("{trajectory}", TRAJECTORY_COLOUR)


def load_tree(path: str | Path, epoch: int | None = None, index: int = 0) -> dict[str, Any]:
    """One tree from a run folder (its trees/ dumps; a run root's newest `version_*` with
    trees), a trees jsonl file, or a tree .json file. A bad path, epoch or index is one
    PreflightError naming it and what there is."""
    from flywheel.run.preflight import PreflightError

    path = Path(path)
    if not path.exists():
        raise PreflightError(f"{path}: no such run folder or tree file; pass a run's log folder (runs/quickstart/version_0), "
                             "a trees/epoch_NNNN.jsonl file or a tree .json file")
    if path.is_dir():
        folder = trees_folder(path)
        files = sorted(folder.glob("epoch_*.jsonl"))
        if epoch is None:
            path = files[-1]
        else:
            path = folder / f"epoch_{epoch:04d}.jsonl"
            if epoch < 0 or not path.is_file():
                raise PreflightError(f"--epoch {epoch}: no trees saved for that epoch in {folder}; saved epochs: "
                                     f"{', '.join(str(int(f.stem.split('_')[1])) for f in files)}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise _bad_tree(path, f"not UTF-8 text ({err.reason} at byte {err.start})") from None
    if path.suffix == ".jsonl":
        lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
        if not lines:
            raise PreflightError(f"{path} holds no trees (an empty file)")
        if not 0 <= index < len(lines):
            raise PreflightError(f"--index {index}: {path} holds {len(lines)} trees; choose 0 to {len(lines) - 1}")
        number, text = lines[index]
        where = f"{path}:{number}"
    else:
        where = str(path)
    try:
        tree = json.loads(text)
    except json.JSONDecodeError as err:
        raise _bad_tree(where, f"bad JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(tree, dict) or not isinstance(tree.get("nodes"), list):
        raise _bad_tree(where, "JSON, but not a saved tree (no `nodes` list)")
    return tree


def trees_folder(run: Path) -> Path:
    """The folder of a run's saved trees: `<run>/trees`, the run folder itself, or, given a run
    root (runs/quickstart), the trees of its newest `version_*` that saved any."""
    from flywheel.run.preflight import PreflightError

    for folder in (run / "trees", run):
        if any(folder.glob("epoch_*.jsonl")):
            return folder
    versions = sorted((v for v in run.glob("version_*") if v.is_dir() and any(v.glob("trees/epoch_*.jsonl"))),
                      key=lambda v: int(v.name.split("_", 1)[1]) if v.name.split("_", 1)[1].isdigit() else -1)
    if versions:
        log.info("%s is a run root: showing the trees of its newest version, %s", run, versions[-1].name)
        return versions[-1] / "trees"
    raise PreflightError(f"no saved trees in {run}: a run saves --data.save_trees trees per epoch into "
                         "<log_dir>/trees/ (e.g. runs/quickstart/version_0/trees); pass such a run folder")


def _bad_tree(where: Any, why: str) -> ValueError:
    from flywheel.run.preflight import PreflightError

    return PreflightError(f"{where}: {why}; the file is truncated or damaged, or not a tree dump of "
                          "`flywheel fit --data.save_trees`")


def default_page_name(tree: dict[str, Any]) -> str:
    """`tree_<problem id>.html`, the id's characters outside [A-Za-z0-9_.-] (a file row's
    `data/x.jsonl:12`) written `_`."""
    return f"tree_{re.sub(r'[^A-Za-z0-9_.-]', '_', str(tree.get('problem_id', 'x')))}.html"


def main(args: list[str]) -> Path:
    parser = StrictParser(prog="python -m flywheel tree", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="a run's log folder, a trees/epoch_NNNN.jsonl file or a tree .json file")
    parser.add_argument("--epoch", type=int, default=None, help="epoch of a run folder's trees (default: the last saved)")
    parser.add_argument("--index", type=int, default=0, help="which tree of that epoch's file (0 = first)")
    parser.add_argument("--out", type=Path, default=None,
                        help="HTML file to write (default: tree_<problem id>.html beside the input)")
    ns = parser.parse_args(args)
    tree = load_tree(ns.path, ns.epoch, ns.index)
    source = Path(ns.path)
    out = ns.out or (source if source.is_dir() else source.parent) / default_page_name(tree)
    atomic_write_bytes(out, render_tree_html(tree).encode())
    print(f"written: {out}")
    return out
