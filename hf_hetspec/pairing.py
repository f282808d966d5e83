"""Placeholder: `hf-hetspec pairing` (being written)."""


def add_command(sub) -> None:
    """Register ``hf-hetspec pairing`` on the CLI's subparsers ``sub``."""
