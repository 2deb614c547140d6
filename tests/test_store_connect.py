"""What every store connection sets up before its first statement."""

from __future__ import annotations

import importlib.machinery
import sys

import pytest

from agentfunnel.collector.store.writer import connect


def test_statements_with_parameters_never_search_the_path_for_a_missing_pandas(tmp_path, monkeypatch):
    if "pandas" in sys.modules or importlib.machinery.PathFinder.find_spec("pandas") is not None:
        pytest.skip("pandas is installed here: DuckDB imports it once and keeps it")
    searched: list[str] = []
    real = importlib.machinery.PathFinder.find_spec

    def find_spec(name, path=None, target=None):
        searched.append(name)
        return real(name, path, target)

    con = connect(tmp_path / "x.duckdb")
    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", find_spec)
    con.execute("CREATE TABLE t (a VARCHAR)")
    for _ in range(5):
        con.execute("INSERT INTO t VALUES (?)", ["x"])
        con.execute("SELECT count(*) FROM t WHERE a IN (SELECT unnest(?))", [["x", "y"]]).fetchall()
    with pytest.raises(ImportError):
        import pandas  # noqa: F401
    assert "pandas" not in searched
    assert con.execute("SELECT count(*) FROM t").fetchone()[0] == 5
