"""One SQLite write transaction of the journal, shared by `journal` and its `journal_state` half."""

from __future__ import annotations

import sqlite3


class Transaction:
    """`with` one: BEGIN IMMEDIATE, then COMMIT, or ROLLBACK when the block raised (the caller holds the lock)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
