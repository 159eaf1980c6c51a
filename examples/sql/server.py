"""The SQL example's MCP server: one `run_sql` tool over a private copy of one sample's SQLite database.

    python -m examples.sql.server            # stdio; examples/sql/tools.yaml starts one per episode

`run_sql(sql, database)` runs one SQL statement. `database` is the sample's database file; the manifest
hides it from the model and fills it from the sample (`hidden_arguments: {run_sql: {database:
${sample.db_path}}}`), so the model writes only the SQL. On the first call the process copies that file
into memory (`sqlite3` backup; the file is opened read-only) and works on the copy from then on: the
agent's inserts and updates change this process's copy, never the file, and since every episode gets its
own process (`scope: episode`), the n trajectories of a sample each start from the same rows and cannot
see each other's changes. The copy is gone when the process exits; nothing is written to disk, which is
also why a warm pool (`pool:`) can start these processes before their episode exists.

A SELECT returns its rows as a small text table (`col | col` header, one line per row, at most
MAX_ROWS); any other statement returns how many rows it changed. `ATTACH`, `DETACH` and `VACUUM` are
refused (they would reach other files), and so is a second database in one process.

What one statement may cost is bounded, so a model's query cannot wedge its episode: a statement running
past MAX_STATEMENT_S is interrupted (a progress handler; a recursive CTE without a stop otherwise runs
until the episode's call times out, holding the server's only thread), a string or blob is at most
MAX_VALUE_BYTES (`randomblob(900000000)` took 900 MB), and the database copy at most MAX_DB_BYTES.
"""
from __future__ import annotations

import os
import sqlite3
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("sql", log_level="WARNING")
MAX_ROWS = 50
REFUSED = ("ATTACH", "DETACH", "VACUUM")
MAX_STATEMENT_S = 5.0
MAX_VALUE_BYTES = 1 << 20
MAX_DB_BYTES = 64 << 20
PROGRESS_EVERY = 10_000  # SQLite virtual-machine instructions between deadline checks (~1 ms)
_db: dict[str, sqlite3.Connection] = {}


def _deny_files(action: int, *_: object) -> int:
    return sqlite3.SQLITE_DENY if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH) else sqlite3.SQLITE_OK


def _connection(database: str) -> sqlite3.Connection:
    if database in _db:
        return _db[database]
    if _db:
        raise ToolError(f"this episode's database is {next(iter(_db))}, not {database}")
    if not os.path.isfile(database):
        raise ToolError(f"database {database} not found (create the example's databases: "
                        "python -m examples.sql.prepare_data)")
    source = sqlite3.connect(f"file:{os.path.abspath(database)}?mode=ro", uri=True)
    copy = sqlite3.connect(":memory:", isolation_level=None)  # autocommit: each statement stands
    try:
        source.backup(copy)
    finally:
        source.close()
    copy.set_authorizer(_deny_files)
    copy.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
    page_size = copy.execute("PRAGMA page_size").fetchone()[0]
    copy.execute(f"PRAGMA max_page_count = {max(1, MAX_DB_BYTES // page_size)}")
    _db[database] = copy
    return copy


# async: every call runs on the server's event loop thread, where the connection was made. The SDK runs a
# sync tool in a worker thread per call, and sqlite3 refuses a connection from another thread ("SQLite
# objects created in a thread can only be used in that same thread": one reward check in five failed).
# The in-memory statements take microseconds, so they may hold the loop.
@server.tool()
async def run_sql(sql: str, database: str) -> str:
    """Run one SQL statement: SELECT returns rows, INSERT and UPDATE change them."""
    if sql.lstrip().split(" ", 1)[0].upper() in REFUSED:
        raise ToolError(f"{sql.split()[0].upper()} is not allowed here")
    conn = _connection(database)
    deadline = time.monotonic() + MAX_STATEMENT_S
    conn.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_EVERY)  # true: interrupt
    try:
        cursor = conn.execute(sql)
        if cursor.description is None:
            return f"OK, {cursor.rowcount} row(s) changed"
        rows = cursor.fetchmany(MAX_ROWS + 1)
    except sqlite3.Error as exc:
        if time.monotonic() > deadline:
            raise ToolError(f"the statement ran past {MAX_STATEMENT_S:g} s and was stopped") from None
        raise ToolError(f"{type(exc).__name__}: {exc}") from None
    finally:
        conn.set_progress_handler(None, 0)
    lines = [" | ".join(d[0] for d in cursor.description)]
    lines += [" | ".join("NULL" if v is None else str(v) for v in row) for row in rows[:MAX_ROWS]]
    if len(rows) > MAX_ROWS:
        lines.append(f"... (more than {MAX_ROWS} rows)")
    return "\n".join(lines)


if __name__ == "__main__":
    server.run()
