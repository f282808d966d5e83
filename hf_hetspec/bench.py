"""Placeholder: `hf-hetspec bench` (being written)."""


def add_command(sub) -> None:
    """Register ``hf-hetspec bench`` on the CLI's subparsers ``sub``."""
