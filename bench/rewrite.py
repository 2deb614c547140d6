"""What ``agentfunnel delete`` costs for the size of the store: the rewrite of the database file.

A deletion ends by rewriting the file from its live rows (``Store.rewrite``: a checkpoint, every row
copied into a fresh file, the files swapped, the file opened again), because DuckDB leaves deleted
values in the file until then. This commits ``--spans`` spans (``payloads.genai_request``: agent,
chat and tool spans, 512 a request) into a fresh store file, checkpoints it, and times ``--runs``
rewrites, printing the file's size and each rewrite's seconds (the writer waits that long).

This is a by-hand benchmark, never part of the test suite. Run it from the repository root:

    python bench/rewrite.py
    python bench/rewrite.py --spans 512000 --runs 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [p for p in (str(HERE),) if p not in sys.path]

from agentfunnel.collector.config import StoreSettings  # noqa: E402
from agentfunnel.collector.decode import decode_traces_protobuf  # noqa: E402
from agentfunnel.collector.store.writer import Store  # noqa: E402
from agentfunnel.collector.telemetry import Metrics  # noqa: E402
from payloads import genai_request  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=102_400, help="spans in the store (rounded down to 512s)")
    parser.add_argument("--runs", type=int, default=3, help="rewrites timed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rewrite.duckdb"
        store = Store(StoreSettings(path=path), Metrics()).open()
        try:
            for fut in [store.submit(decode_traces_protobuf(genai_request(512, seed=i).SerializeToString()))
                        for i in range(args.spans // 512)]:
                fut.result()
            store.submit_job(lambda con: con.execute("CHECKPOINT"), transaction=False).result()
            cur = store.reader()
            spans = cur.execute("SELECT count(*) FROM spans").fetchall()[0][0]
            cur.close()
            print(f"{spans} spans, a file of {path.stat().st_size / 1e6:.1f} MB")
            for _ in range(args.runs):
                print(f"rewrite: {store.rewrite().result()['seconds']:.2f} s")
        finally:
            store.close()


if __name__ == "__main__":
    main()
