"""``pdserve plan``: size a cluster for a peak rate (shell: arguments, files, printing).

    pdserve plan --rate 5200 --out plans/reference

Simulates a slice of the fleet with pdserve's own routing policies (tools/planner/) and
prints the cheapest replica counts it finds that meet the SLOs, their cost and predicted
latencies, and writes them with a pdserve config of that cluster. docs/planning.md.

Loaded through an entry point on every ``pdserve`` invocation, so it stays light: its
arguments are tools/planner/arguments.py's, and each action's body (size_command.py,
calibrate_command.py, replay_command.py) is imported only when it runs.
"""

from __future__ import annotations

from tools.planner.arguments import add_parser

__all__ = ["add_parser", "main"]


def main(args) -> int:
    """Run ``pdserve plan``'s action (size by default) on the parsed ``args``."""
    if args.action == "calibrate":
        from tools.planner import calibrate_command

        return calibrate_command.run(args)
    if args.action == "replay":
        from tools.planner import replay_command

        return replay_command.run(args)
    from tools.planner import size_command

    return size_command.run(args)
