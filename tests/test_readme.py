"""README's first screen keeps exactly the two set-up commands, and CI runs the test one."""

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
