"""The one check on text that reaches a node's annotations, events or the log: one line.

Names and values come from the cluster and from registries (a node's annotations, a policy's
fields, an error body). Whatever carries a line break or a control character would forge lines
in the log or garble an annotation, so every such text goes through :func:`one_line` before it
is written anywhere. Kept in one place, and small, so that a project-wide validator can replace
it.
"""

from __future__ import annotations

import unicodedata

LIMIT = 400  # characters: an event message or an annotation an operator reads at a glance


def one_line(text: object, limit: int = LIMIT) -> str:
    """``text`` with every control, format or line-separator character replaced by a space,
    cut to ``limit`` characters (the cut marked with an ellipsis)."""
    clean = "".join(
        " " if unicodedata.category(char) in {"Cc", "Cf", "Zl", "Zp"} else char
        for char in str(text)
    )
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"
