"""Read traces written as calls, ``allocate(b=0); commit(b=0)``, with Python's own parser.

A trace is what the reports print and ``--replay`` takes: one call per line or ``;``-separated,
keyword arguments with integer values, ``# comments``, and optionally a step number before
each call (``  3. load_start(b=0)``, as the reports number them).  That is Python call syntax,
so :mod:`ast` reads it (the step numbers are dropped first): no hand-written tokenizer to
disagree with the printer about spaces, signs or comments.
"""

from __future__ import annotations

import ast
import re

# a line's indentation and step number ("  3. " before a call), dropped before parsing
_NUMBER = re.compile(r"^[ \t]*(?:\d+[.)][ \t]+)?", re.MULTILINE)


def parse_calls(text: str) -> list[tuple[str, list[tuple[str, int]]]]:
    """``text`` as (name, [(keyword, integer), ...]) per call, in order.

    Raises :class:`ValueError`, naming the piece it cannot read, for anything but calls of a
    plain name with integer keyword arguments."""
    source = _NUMBER.sub("", text)
    try:
        tree = ast.parse(source, mode="exec")
    except SyntaxError as exc:
        bad = (exc.text or "").strip() or source.strip()
        raise ValueError(f"cannot read {bad!r}: {exc.msg} (expected action(p=1, ...))") from None
    out: list[tuple[str, list[tuple[str, int]]]] = []
    for stmt in tree.body:
        piece = ast.get_source_segment(source, stmt) or ast.unparse(stmt)
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if (
            not isinstance(call, ast.Call)
            or not isinstance(call.func, ast.Name)
            or call.args
            or any(k.arg is None for k in call.keywords)
            or len({k.arg for k in call.keywords}) < len(call.keywords)
        ):
            raise ValueError(f"cannot read {piece!r} (expected action(p=1, ...))")
        args: list[tuple[str, int]] = []
        for k in call.keywords:
            try:
                value = ast.literal_eval(k.value)
            except ValueError:
                value = None
            if type(value) is not int:
                raise ValueError(f"bad parameter {ast.unparse(k)!r} in {piece!r} (an integer)")
            args.append((str(k.arg), value))
        out.append((call.func.id, args))
    return out
