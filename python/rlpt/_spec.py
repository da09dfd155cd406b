# SPDX-License-Identifier: Apache-2.0
"""Option strings of the rlpt ops: "key=value;key=value" (torch custom ops take strings as
constants, so torch.compile bakes an objective into its graph)."""
import math


def _value(v):
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    s = str(v)
    if ";" in s or "=" in s:
        raise ValueError(f"option value {s!r} may not contain ';' or '='")
    return s


def make(**opts):
    """The option string of keyword options (None values are passed as "none")."""
    parts = []
    for k, v in opts.items():
        parts.append(f"{k}={_value(v)}")
    return ";".join(parts)


def merge(spec, **opts):
    extra = make(**opts)
    if not spec:
        return extra
    return spec + (";" + extra if extra else "")
