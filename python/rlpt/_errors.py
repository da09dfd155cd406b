# SPDX-License-Identifier: Apache-2.0
"""rlpt.Error: a ValueError carrying rlpt's stable error id."""
import re

import torch

_PREFIX = re.compile(r"rlpt::error \[([a-z0-9_.]+)\]: (.*)", re.S)


class Error(ValueError):
    """Raised for invalid input. ``id`` is rlpt's stable error id (``"rlpt.objective.missing_input"``,
    constants in include/rlpt/core/error_ids.hpp; the binding's own ids start with ``rlpt.python.``),
    ``message`` the text without it."""

    def __init__(self, id, message):
        super().__init__(f"rlpt::error [{id}]: {message}")
        self.id = id
        self.message = message


def error_id(exc):
    """The rlpt error id of an exception (an rlpt.Error, or the ValueError a compiled graph raises
    from an rlpt op), or None."""
    if isinstance(exc, Error):
        return exc.id
    m = _PREFIX.search(str(exc))
    return m.group(1) if m else None


def _translate(exc):
    m = _PREFIX.search(str(exc))
    if not m:
        return exc
    msg = m.group(2).split("\nException raised from", 1)[0].rstrip()
    return Error(m.group(1), msg)


def call(op, *args):
    """op(*args), with rlpt's errors raised as rlpt.Error in eager mode. Under torch.compile the op
    is traced (its fake kernel runs) and a failure at run time is the ValueError the kernel threw,
    whose message starts with the id (rlpt.error_id reads it)."""
    if torch.compiler.is_compiling():
        return op(*args)
    try:
        return op(*args)
    except (ValueError, RuntimeError) as e:  # torch < 2.5's dispatcher turns the kernel's ValueError into RuntimeError
        t = _translate(e)
        if t is e:
            raise
        raise t from None
