"""Evaluation and reporting: held-out pass@k (`evaluation`) and the `flywheel eval` command
(`eval_command`), metric formulas (`metrics`), the run report (`report`), the tree viewer
(`viewer`), the progress bars and their plain lines off a terminal (`bars`)."""
