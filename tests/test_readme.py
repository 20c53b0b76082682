"""README's first screen keeps exactly the two set-up commands, and CI runs the test one."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def first_block_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.strip().splitlines() if line.strip()]


def test_readme_has_the_quickstart_and_the_test_command():
    commands = first_block_commands()
    assert len(commands) == 2
    assert "python -m flywheel fit --config conf/quickstart.yaml" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command_verbatim():
    assert first_block_commands()[1] in (ROOT / ".ci" / "run").read_text()


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH_IN_CODE = re.compile(r"`((?:conf|tools|docs)/[\w./-]+\.(?:yaml|py|md|sh|json))`")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_readme_stays_short_and_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"


def test_every_relative_link_and_named_file_resolves():
    """Every relative link of README.md and docs/*.md points at a file that exists, and every
    conf/, tools/ or docs/ file named in code spans exists (a renamed file breaks this test)."""
    missing = []
    for page in pages():
        text = page.read_text()
        for target in LINK.findall(text):
            if target.startswith(("http://", "https://", "#", "mailto:")):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                missing.append(f"{page.relative_to(ROOT)}: link {target}")
        for named in PATH_IN_CODE.findall(text):
            if not (ROOT / named).exists():
                missing.append(f"{page.relative_to(ROOT)}: names {named}")
    assert not missing, missing


def test_link_check_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("see [there](nowhere.md) and [ok](page.md)")
    targets = [t for t in LINK.findall(page.read_text()) if not (page.parent / t).exists()]
    assert targets == ["nowhere.md"]
