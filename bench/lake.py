"""Combined ingest rate of 1, 2 and 3 agentfunnel replicas writing one DuckLake (spans/s acknowledged).

Each run gets a fresh lake (a new database in a private PostgreSQL, a new Parquet directory) and
N ``agentfunnel serve`` replicas from the lake environment. GenAI-shaped requests
(``payloads.genai_request``) are split by trace id the way the Collector's loadbalancing exporter
would (the test router's ``split``) and posted over OTLP/HTTP by 4 clients per replica; a request
counts when its response arrived, i.e. after the replica committed it to the lake. Afterwards the
stored row count is checked through a lake reader. Idle assembly is left running, as in production.

By hand, from the repository root, with the lake environment made (``.ci/run`` does it):

    python bench/lake.py                     # 1, 2, 3 replicas, 60 requests of 512 spans each
    python bench/lake.py --replicas 3 --requests 300
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from conftest import ServerProcess  # noqa: E402
from lake_support import Postgres, free_port, lake_config, lake_python, lake_rows, pg_bindir, split  # noqa: E402
from payloads import genai_request  # noqa: E402


def post(url: str, body: bytes) -> None:
    while True:
        req = urllib.request.Request(url + "/v1/traces", data=body, method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)  # pushed back: retry


def run(pg: Postgres, python: str, replicas: int, requests: int, clients: int) -> tuple[float, int]:
    tmp = Path(tempfile.mkdtemp(prefix="agentfunnel-lakebench-"))
    catalog = pg.createdb(f"bench_{replicas}_{int(time.time())}")
    configs = [lake_config(tmp / f"r{i}.yaml", catalog, tmp / "data", i, replicas) for i in range(replicas)]
    servers = [ServerProcess(c.with_suffix(".duckdb"), ["--config", str(c), "--grpc-port", str(free_port())],
                             python=python) for c in configs]
    threads = [threading.Thread(target=s.start, kwargs={"timeout": 120}) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    work: list[tuple[int, bytes, int]] = []
    for seed in range(requests):
        for i, part in split(genai_request(512, seed=seed), replicas).items():
            n = sum(len(ss.spans) for rs in part.resource_spans for ss in rs.scope_spans)
            work.append((i, part.SerializeToString(), n))
    try:
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=clients * replicas) as pool:
            list(pool.map(lambda w: post(servers[w[0]].http_url, w[1]), work))
        elapsed = time.perf_counter() - t0
        sent = sum(w[2] for w in work)
        stored = lake_rows(python, configs[0], {"n": "SELECT count(*) AS n FROM spans"})["n"][0]["n"]
        assert stored == sent, (stored, sent)
        return sent / elapsed, sent
    finally:
        for s in servers:
            s.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, nargs="*", default=[1, 2, 3])
    ap.add_argument("--requests", type=int, default=60, help="requests of 512 spans, before splitting")
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients per replica")
    args = ap.parse_args()
    python, why = lake_python()
    bindir = pg_bindir()
    if python is None or bindir is None:
        print(why or "no PostgreSQL server binaries", file=sys.stderr)
        return 2
    pg = Postgres(bindir).start()
    try:
        for n in args.replicas:
            rate, spans = run(pg, python, n, args.requests, args.clients)
            print(f"{n} replica(s): {rate:,.0f} spans/s into the lake ({spans} spans)", flush=True)
    finally:
        pg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
