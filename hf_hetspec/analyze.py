"""Placeholder: `hf-hetspec analyze` (being written)."""


def add_command(sub) -> None:
    """Register ``hf-hetspec analyze`` on the CLI's subparsers ``sub``."""
