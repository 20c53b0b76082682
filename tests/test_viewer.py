"""The tree viewer renders a real search tree into a self-contained page that a headless
browser loads and runs (screenshot taken); plus its colour scale and expansion order."""

import functools
import json
import re
import shutil
import subprocess

import pytest

from flywheel.__main__ import main
from flywheel.reporting.problem_view import encode_prompt
from flywheel.generation.hf import HFGenerator
from flywheel.policies.load import load_policy
from flywheel.search import SearchConfig, SearchDriver, SearchProblem
from flywheel.tasks.countdown import CountdownTask
from flywheel.reporting.viewer import LABELS, expansion_order, render_tree_html, value_colour


def test_value_colour_scale():
    assert value_colour(-1.0) == "#d73027" and value_colour(0.0) == "#f7f7f7" and value_colour(1.0) == "#1a9850"
    assert value_colour(5.0) == value_colour(1.0) and value_colour(None) == "#dddddd"


def test_expansion_order_follows_child_creation():
    nodes = [{"id": 0, "children": [1, 2]}, {"id": 1, "children": [5, 6]}, {"id": 2, "children": [3, 4]},
             {"id": 3, "children": []}, {"id": 4, "children": []}, {"id": 5, "children": []}, {"id": 6, "children": []}]
    assert expansion_order(nodes) == {0: 1, 2: 2, 1: 3}


@pytest.fixture(scope="module")
def tree_json(one_thread):
    model, tok = load_policy("tiny-countdown")
    task = CountdownTask(numbers_count=3)
    problem = task.problems("test")[0]
    search = SearchProblem(prompt_ids=encode_prompt(tok, task, problem), score=functools.partial(task.score, problem), id=problem.id)
    decode = functools.partial(tok.decode, skip_special_tokens=True)
    config = SearchConfig(max_depth=8, expansion_width=4, trajectories_per_tree=4, max_expansions_per_tree=32)
    driver = SearchDriver(HFGenerator(model.eval(), tok, seed=0), config, step=task.step, decode=decode,
                          eos_token_ids=[tok.eos_token_id])
    (result,) = driver.run([search])
    return result.to_json(decode, logprobs=False)


def test_page_holds_every_node_and_trajectory(tree_json, tmp_path):
    page = render_tree_html(tree_json)
    assert page.count('class="node"') == len(tree_json["nodes"])
    for t in tree_json["trajectories"]:
        assert f">K{t['backup_index'] + 1}</text>" in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")  # no external resources
    with pytest.raises(ValueError, match="not a search tree dump"):
        render_tree_html({"format": "something else"})

    trees = tmp_path / "trees"
    trees.mkdir()
    (trees / "epoch_0003.jsonl").write_text(json.dumps(tree_json) + "\n")
    out = main(["tree", str(tmp_path), "--out", str(tmp_path / "t.html")])
    assert out.read_text() == page
    with pytest.raises(ValueError, match="--epoch 7: no trees saved for that epoch .*saved epochs: 3"):
        main(["tree", str(tmp_path), "--epoch", "7"])


def test_page_explains_its_labels_and_shows_the_prompt_as_the_policy_saw_it(tree_json):
    seen = {**tree_json, "prompt_seen": "<s>" + tree_json["prompt_text"]}  # as the run writes it: special tokens kept
    page = render_tree_html(seen)
    assert '<span id="prompt">&lt;s&gt;' in page
    for label in ("q~", "PRM V", "#n", "eN", "mean NLL"):
        assert f"<dt>{label}</dt>" in page
    assert len(LABELS) == page.count("<dt>")


def test_labels_and_links_agree_and_the_caption_fits_any_task(tree_json, tmp_path):
    """The nodes were labelled #n by expansion order while `#node=12` opened node id 12, and the
    prompt was captioned as a Countdown one on a chain run; `tree` wrote tree_<id>.html where its
    --help said tree.html."""
    page = render_tree_html(tree_json)
    order = expansion_order(tree_json["nodes"])
    labels = re.findall(r'<text class="order"[^>]*>([^<]*)</text>', page)
    assert sorted(labels) == sorted(f"e{n}" for n in order.values())  # expansion order: eN, never #N
    for node in tree_json["nodes"]:  # the id, the anchor's number, is #id in the hover text
        assert re.search(rf'data-id="{node["id"]}"[^>]*>[^<]*<title>#{node["id"]} depth', page)
    assert "location.hash.match(/(node|expansion)=(\\d+)/)" in page
    assert "Countdown" not in page
    trees = tmp_path / "trees"
    trees.mkdir()
    (trees / "epoch_0000.jsonl").write_text(json.dumps({**tree_json, "problem_id": "data/x.jsonl:12"}) + "\n")
    assert main(["tree", str(tmp_path)]) == tmp_path / "tree_data_x.jsonl_12.html"
    assert "default: tree_<problem id>.html beside the input" in " ".join(viewer_help().split())


def viewer_help() -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["tree", "--help"])
    return out.getvalue()


def test_headless_chromium_opens_a_node_by_its_expansion_label(tree_json, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("headless Chromium is not installed (Debian package `chromium`; .ci/run installs it)")
    order = expansion_order(tree_json["nodes"])
    node, place = max(order.items(), key=lambda item: item[1])
    page = tmp_path / "tree.html"
    page.write_text(render_tree_html(tree_json))
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          page.as_uri() + f"#expansion={place}"], capture_output=True, text=True, timeout=120).stdout
    assert f"node #{node}  depth" in dom and f"expansion e{place}" in dom


def test_headless_chromium_shows_a_linked_nodes_whole_path_from_the_root(tree_json, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("headless Chromium is not installed (Debian package `chromium`; .ci/run installs it)")
    by_id = {n["id"]: n for n in tree_json["nodes"]}
    deepest = max(tree_json["nodes"], key=lambda n: n["depth"])
    steps, node = [], deepest
    while node["parent"] is not None:
        steps.insert(0, node["text"])
        node = by_id[node["parent"]]
    page = tmp_path / "tree.html"
    page.write_text(render_tree_html(tree_json))
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri() + f"#node={deepest['id']}"], capture_output=True,
                         text=True, timeout=120).stdout
    import html as html_lib

    details = html_lib.unescape(dom.split('<div id="details">', 1)[1].split("</div>", 1)[0])
    assert f"({deepest['depth']} steps, each after a ¦):\n" + tree_json["prompt_text"] + "".join("¦" + s for s in steps) in details


def test_headless_chromium_loads_the_page_and_takes_a_screenshot(tree_json, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("headless Chromium is not installed (Debian package `chromium`; .ci/run installs it)")
    page = tmp_path / "tree.html"
    page.write_text(render_tree_html(tree_json))
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,800"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    # The page's script ran: it parsed the embedded tree and marked the body with the node count.
    assert f'data-rendered="{len(tree_json["nodes"])}"' in dom.stdout, dom.stderr[-2000:]
    shot = tmp_path / "tree.png"
    subprocess.run([*flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a drawn page, not a blank one
