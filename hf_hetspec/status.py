"""Status lines: what hf_hetspec is doing during a pause the user would otherwise not understand.

Preparing a drafter runtime (:mod:`hf_hetspec.runtime`) takes seconds (an int8 copy) to minutes (compiling the
step), once per drafter and process, inside the first ``generate()`` call. Those pauses are announced on the
``"hf_hetspec"`` logger at ``INFO`` level. Like transformers' own library logger, it has a handler of its own
(standard error, ``hf_hetspec: <message>``) and does not propagate, so the line shows without any logging
setup; silence it with ``logging.getLogger("hf_hetspec").setLevel(logging.WARNING)``.
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "hf_hetspec"


class _StandardError(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time (a notebook's or a test's replacement included)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 -- logging's own rule: a failing handler must not break the caller
            self.handleError(record)


def logger() -> logging.Logger:
    """The library's logger, given its stderr handler on first use (unless someone configured it before)."""
    log = logging.getLogger(LOGGER_NAME)
    if not log.handlers:
        handler = _StandardError()
        handler.setFormatter(logging.Formatter("hf_hetspec: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)
    return log


def status(message: str) -> None:
    """Say ``message`` on one line (``INFO`` on the ``"hf_hetspec"`` logger)."""
    logger().info(message)
