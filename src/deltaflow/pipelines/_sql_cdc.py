"""AUTO CDC in pipeline SQL files, as Lakeflow writes it:

    CREATE FLOW name AS AUTO CDC [ONCE] INTO target
    FROM STREAM(source) KEYS (k1, k2)
    [IGNORE NULL UPDATES] [APPLY AS DELETE WHEN cond] [APPLY AS TRUNCATE WHEN cond]
    SEQUENCE BY expr
    [COLUMNS {c1, c2 | * EXCEPT (c1, c2)}]
    [STORED AS {SCD TYPE 1 | SCD TYPE 2}]
    [TRACK HISTORY ON {c1, c2 | * EXCEPT (c1, c2)}]

and the older ``APPLY CHANGES INTO [LIVE.]target FROM STREAM([LIVE.]source) KEYS ...``
with the same clauses (the flow takes the target's name). Both become the declaration
``create_auto_cdc_flow`` makes. ``LIVE.`` prefixes are dropped (datasets live in the
pipeline's database). ``SYSTEM SEQUENCE BY``, ``STORED AS BITEMPORAL`` and ``COLUMNS TO
UPDATE`` are refused with a :class:`DefinitionError`.
"""

from __future__ import annotations

import re
from typing import Any

from deltaflow.pipelines._api import declare_auto_cdc_flow
from deltaflow.pipelines._declarations import SourceLocation
from deltaflow.pipelines.errors import DefinitionError

_NAME = r"(?:`[^`]+`|[\w.]+)"
_HEAD = re.compile(
    rf"""^\s*(?:
        CREATE\s+FLOW\s+(?P<flow>{_NAME})\s+AS\s+AUTO\s+CDC\s+(?P<once>ONCE\s+)?INTO
        | APPLY\s+CHANGES\s+INTO
    )\s+(?P<target>{_NAME})\s+FROM\s+""",
    re.IGNORECASE | re.VERBOSE,
)
_SOURCE = re.compile(
    rf"^(?:STREAM\s*\(\s*(?P<call>{_NAME})\s*\)|STREAM\s+(?P<kw>{_NAME})|(?P<plain>{_NAME}))\s*",
    re.IGNORECASE,
)
# Clause keywords, longest first where one starts another.
_CLAUSES = {
    "KEYS": r"KEYS",
    "IGNORE NULL UPDATES": r"IGNORE\s+NULL\s+UPDATES",
    "APPLY AS DELETE WHEN": r"APPLY\s+AS\s+DELETE\s+WHEN",
    "APPLY AS TRUNCATE WHEN": r"APPLY\s+AS\s+TRUNCATE\s+WHEN",
    "SYSTEM SEQUENCE BY": r"SYSTEM\s+SEQUENCE\s+BY",
    "SEQUENCE BY": r"SEQUENCE\s+BY",
    "COLUMNS TO UPDATE": r"COLUMNS\s+TO\s+UPDATE",
    "COLUMNS": r"COLUMNS",
    "STORED AS": r"STORED\s+AS",
    "TRACK HISTORY ON": r"TRACK\s+HISTORY\s+ON",
}
_UNSUPPORTED = {
    "SYSTEM SEQUENCE BY": "SYSTEM SEQUENCE BY (a second ordering column)",
    "COLUMNS TO UPDATE": "COLUMNS TO UPDATE",
}
_CLAUSE = re.compile(
    r"\b(?:" + "|".join(f"(?P<c{i}>{p})" for i, p in enumerate(_CLAUSES.values())) + r")\b",
    re.IGNORECASE,
)


def is_auto_cdc(statement: str) -> bool:
    return _HEAD.match(statement) is not None


def declare(statement: str, where: SourceLocation) -> None:
    """Declare the AUTO CDC flow ``statement`` describes (see the module docstring)."""
    head = _HEAD.match(statement)
    assert head is not None
    target = _unqualified(head.group("target"))
    flow = head.group("flow")
    rest = statement[head.end() :]
    source = _SOURCE.match(rest)
    if source is None:
        raise _error(where, target, f"expected FROM STREAM(source), got {rest[:40]!r}")
    name = source.group("call") or source.group("kw") or source.group("plain")
    clauses = _clauses(rest[source.end() :], where, target)
    for clause, what in _UNSUPPORTED.items():
        if clause in clauses:
            raise _error(where, target, f"{what} is not supported")
    if "KEYS" not in clauses or "SEQUENCE BY" not in clauses:
        raise _error(where, target, "KEYS (...) and SEQUENCE BY ... are required")
    options: dict[str, Any] = {
        "target": target,
        "source": _unqualified(name),
        "keys": _list(_parenthesised(clauses["KEYS"], where, target, "KEYS")),
        "sequence_by": clauses["SEQUENCE BY"],
        "ignore_null_updates": "IGNORE NULL UPDATES" in clauses,
        "apply_as_deletes": clauses.get("APPLY AS DELETE WHEN"),
        "apply_as_truncates": clauses.get("APPLY AS TRUNCATE WHEN"),
        "stored_as_scd_type": _scd(clauses.get("STORED AS"), where, target),
        "name": _unqualified(flow) if flow else None,
        "once": head.group("once") is not None,
    }
    if clauses.get("IGNORE NULL UPDATES"):
        raise _error(where, target, "IGNORE NULL UPDATES ON (a column list) is not supported")
    if "COLUMNS" in clauses:
        include, exclude = _selection(clauses["COLUMNS"], where, target, "COLUMNS")
        options["column_list"], options["except_column_list"] = include, exclude
    if "TRACK HISTORY ON" in clauses:
        include, exclude = _selection(clauses["TRACK HISTORY ON"], where, target, "TRACK HISTORY")
        options["track_history_column_list"] = include
        options["track_history_except_column_list"] = exclude
    declare_auto_cdc_flow(where, "AUTO CDC INTO", **options)


def _clauses(text: str, where: SourceLocation, target: str) -> dict[str, str]:
    """Each clause keyword (outside quotes and parentheses) -> the text up to the next."""
    names = list(_CLAUSES)
    found: list[tuple[int, int, str]] = []
    for match in _CLAUSE.finditer(text):
        if _depth_at(text, match.start()) == 0:
            index = next(i for i in range(len(names)) if match.group(f"c{i}") is not None)
            found.append((match.start(), match.end(), names[index]))
    if not found or text[: found[0][0]].strip():
        raise _error(where, target, f"expected KEYS (...) after the source, got {text[:40]!r}")
    clauses: dict[str, str] = {}
    for i, (_, end, name) in enumerate(found):
        stop = found[i + 1][0] if i + 1 < len(found) else len(text)
        if name in clauses:
            raise _error(where, target, f"{name} is given twice")
        clauses[name] = text[end:stop].strip()
    return clauses


def _depth_at(text: str, position: int) -> int:
    """Parenthesis depth at ``position``, quotes skipped (-1 inside a quote)."""
    depth, quote = 0, None
    for ch in text[:position]:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
    return -1 if quote else depth


def _parenthesised(text: str, where: SourceLocation, target: str, clause: str) -> str:
    text = text.strip()
    if not (text.startswith("(") and text.endswith(")")):
        raise _error(where, target, f"{clause} takes a parenthesised list, got {text!r}")
    return text[1:-1]


def _list(text: str) -> list[str]:
    return [part.strip().strip("`") for part in text.split(",") if part.strip()]


def _selection(
    text: str, where: SourceLocation, target: str, clause: str
) -> tuple[list[str] | None, list[str] | None]:
    """``c1, c2`` -> (include, None); ``* EXCEPT (c1, c2)`` -> (None, exclude)."""
    found = re.match(r"^\*\s*EXCEPT\s*(\(.*\))\s*$", text, re.IGNORECASE | re.DOTALL)
    if found:
        return None, _list(_parenthesised(found.group(1), where, target, clause))
    columns = _list(text.strip("() \n"))
    if not columns:
        raise _error(where, target, f"{clause} names no column")
    return columns, None


def _scd(text: str | None, where: SourceLocation, target: str) -> int:
    if text is None:
        return 1
    found = re.fullmatch(r"SCD\s+TYPE\s+([12])", text.strip(), re.IGNORECASE)
    if found is None:
        raise _error(where, target, f"STORED AS takes SCD TYPE 1 or SCD TYPE 2, got {text!r}")
    return int(found.group(1))


def _unqualified(name: str) -> str:
    name = name.strip("`")
    return name[len("live.") :] if name.lower().startswith("live.") else name


def _error(where: SourceLocation, target: str, problem: str) -> DefinitionError:
    return DefinitionError(
        f"{where}: AUTO CDC INTO {target!r}: {problem}. The form is CREATE FLOW name AS AUTO"
        " CDC INTO target FROM STREAM(source) KEYS (k, ...) [APPLY AS DELETE WHEN cond]"
        " SEQUENCE BY col [COLUMNS ... | * EXCEPT (...)] [STORED AS SCD TYPE 1|2]",
        dataset=target,
        location=str(where),
    )
