"""What the store's query endpoint answers: one read-only statement, within limits.

The endpoint runs analysts' SQL inside the process that writes the store, so it answers only what cannot change or
leave it: one SELECT, SHOW, DESCRIBE or EXISTS statement; no table function but the generators and views below (no
file(), url(), s3(), remote(), mysql(), executable() …) and no file() as a function either (readonly mode allows
that one); run with readonly=1 and row, byte, memory and time limits in the query's own SETTINGS clause. The clause
binds only that query; settings passed beside a query would stay on the embedded engine's one session and bind the
sink's writes too.

ClickHouse's own parser decides (EXPLAIN AST, which runs nothing); a ';' anywhere but at the end is refused first,
because the embedded engine runs every statement of a multi-statement text.
"""

from __future__ import annotations

import re

from core.clickhouse import QueryLimits
from core.errors import StoreError

ROOTS = {"SelectWithUnionQuery": "select", "ShowTables": "show", "DescribeQuery": "show",
         "ShowCreateTableQuery": "show", "ExistsTableQuery": "show"}
TABLE_FUNCTIONS = {"numbers", "numbers_mt", "zeros", "zeros_mt", "generate_series", "generateseries", "values",
                   "view", "merge", "null"}  # generators and views over this store's own tables
FUNCTIONS_REFUSED = {"file"}  # reads a file of the server's host, even in readonly mode
_FORMAT_CLAUSE = re.compile(r"\s+FORMAT\s+(\w+)\s*$", re.IGNORECASE)
_NODE = re.compile(r"^( *)(\S+)(?: (\S+))?")


class QueryRefused(StoreError):
    """The endpoint does not run this statement; the message says why. `status`: 403 for what is not answered here,
    400 for what is not one statement ClickHouse can parse."""

    def __init__(self, message: str, status: int = 403):
        super().__init__(message)
        self.status = status


def split(sql: str) -> tuple[str, str]:
    """(statement, output format): one statement, its trailing ';' and FORMAT clause taken off."""
    body = sql.strip()
    body = body[:-1].rstrip() if body.endswith(";") else body
    if not body:
        raise QueryRefused("empty query", 400)
    if ";" in body:
        raise QueryRefused("one statement per request: ';' is refused before the end (in a string, write char(59))",
                           400)
    match = _FORMAT_CLAUSE.search(body)
    return (body[:match.start()], match.group(1)) if match else (body, "TabSeparated")


def refusal(ast: str) -> str | None:
    """Why the statement whose EXPLAIN AST text this is may not run here; None when it may."""
    lines = ast.splitlines()
    root = _NODE.match(lines[0]).group(2) if lines else ""
    if root not in ROOTS:
        return f"only SELECT, SHOW, DESCRIBE and EXISTS are answered here, not {root or 'this statement'}"
    parents: list[tuple[int, str]] = []
    for line in lines:
        m = _NODE.match(line)
        if m is None:
            continue
        depth, node, name = len(m.group(1)), m.group(2), (m.group(3) or "")
        while parents and parents[-1][0] >= depth:
            parents.pop()
        parent = parents[-1][1] if parents else ""
        parents.append((depth, node))
        if node != "Function":
            continue
        if parent == "TableExpression" and name.lower() not in TABLE_FUNCTIONS:
            return f"table function {name}() is not answered here (it reads outside this store)"
        if name.lower() in FUNCTIONS_REFUSED:
            return f"{name}() is not answered here (it reads files of the server's host)"
    return None


def guarded(ast_of, sql: str, limits: QueryLimits) -> tuple[str, str]:
    """(statement to run, format) for `sql`, or QueryRefused. `ast_of(statement)` returns its EXPLAIN AST text."""
    body, fmt = split(sql)
    try:
        ast = ast_of(body)
    except StoreError as exc:
        raise QueryRefused(f"cannot parse: {exc}", 400) from None
    reason = refusal(ast)
    if reason is not None:
        raise QueryRefused(reason)
    root = _NODE.match(ast.splitlines()[0]).group(2)
    if ROOTS[root] == "select":
        return f"SELECT * FROM ({body}\n) {limits.clause()}", fmt
    return f"{body} SETTINGS readonly=1", fmt
