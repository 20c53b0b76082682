"""One section of `fit --help`: `python -m flywheel fit --help data.search` prints the options of
`--data.search.*` (and of its subsections) with their section titles, not the whole 1,500 lines.

argparse's `--help` takes no value, so the command line's `--help SECTION` (or `--help=SECTION`)
is taken apart here before the parser sees it (`help_section`); the section is then printed from
the subcommand's parser (`section_help`), whose groups jsonargparse keys by their dotted prefix
("trainer", "data.search", "data.credit.path_weights", ...).
"""

from __future__ import annotations

from typing import Any

HELP_FLAGS = ("-h", "--help")


def help_section(argv: list[str]) -> tuple[list[str], str | None]:
    """`argv` without the section named after `--help`, and that section (None when `--help` has
    none, or when there is no `--help`). A section is a word after `--help` that is not a flag:
    `fit --help data.search`, `fit --help=data.search`."""
    for i, arg in enumerate(argv):
        if arg.startswith("--help="):
            return argv[:i] + ["--help"] + argv[i + 1:], arg.split("=", 1)[1].strip("-") or None
        if arg in HELP_FLAGS and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[:i + 1] + argv[i + 2:], argv[i + 1].strip("-")
    return argv, None


def section_help(parser: Any, section: str, command: str) -> str:
    """The help of `parser`'s option groups under `section` (its own group and its subsections').
    An unknown section raises ValueError listing the sections there are."""
    groups = getattr(parser, "groups", None) or {}
    chosen = [key for key in groups if key == section or key.startswith(section + ".")]
    if not chosen:
        known = ", ".join(key for key in groups if key != command)
        raise ValueError(f"`{command} --help {section}`: no such section; the sections are: {known} "
                         f"(or `{command} --help` for all of them)")
    # The parser's own help, limited to these groups and a one-line usage for the while.
    saved = parser._action_groups, parser.usage
    parser._action_groups = [groups[key] for key in chosen]
    parser.usage = (f"python -m flywheel {command} [--{section}.* ...]  "
                    f"(`python -m flywheel {command} --help` for every section)")
    try:
        return parser.format_help()
    finally:
        parser._action_groups, parser.usage = saved


def describe_rule_tables(parser: Any) -> None:
    """Each rule flag's help ends with the rules its table holds now, one `name: summary` each
    (flywheel.tables.FAMILIES): the library's and those a plugin registered (`--plugins`), so
    --help never lists a name by hand."""
    from flywheel.tables import FAMILIES

    actions = {action.dest: action for action in parser._actions}
    for flag, table in FAMILIES.items():
        action = actions.get(flag.lstrip("-"))
        if action is None:
            continue
        rules = "; ".join(f"{name}: {rule.summary}" if rule.summary else name for name, rule in table.items())
        action.help = f"{action.help or ''} Registered rules (the first is the default): {rules}.".lstrip()
