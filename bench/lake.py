"""CPU per span of 1, 2 and 3 agentfunnel replicas on one DuckLake, at the same offered load.

Each run gets a fresh lake (a new database in a private PostgreSQL, a new Parquet directory) and
N ``agentfunnel serve`` replicas from the lake environment, with the shipping defaults (each
replica commits into its own file and ships every 10 s or 200,000 rows), no scheduled compaction
(the bench compacts at the end, to count files before and after), traces idle after 2 s, and one
DuckDB thread per replica (``store.threads: 1``; the default 2 would give three replicas on two
cores six DuckDB threads), the same for every N. GenAI-shaped requests
(``payloads.genai_request``, 512 spans) are split by trace id the way the Collector's
loadbalancing exporter would (the test router's ``split``), each replica's shares merged the way
the Collector's batch per replica in ``deploy/otelcol.yaml`` merges them (``--no-batch``: sent as
they come), and posted over OTLP/HTTP at a fixed rate, the same for every N (``--turns``: the
agent sessions of ``ingest.py --sessions`` instead, each turn its own trace, so an owner scores a
session again from the turns before). After the last one every replica is flushed (traces
assembled, sessions scored, everything shipped), and the stored row count is checked through a
lake reader.

Measured over that window, for every process involved (the replicas, with their shipper threads,
and PostgreSQL: the postmaster, its live backends and the backends that exited):

- CPU-seconds per span (user + system), and its ratio to one replica's;
- catalog transactions per million spans: DuckLake snapshots committed (every write transaction
  is one), and PostgreSQL's own commits (reads included);
- Parquet files per million spans in the lake's current snapshot, before and after
  ``ducklake_merge_adjacent_files`` (what the replicas' scheduled compaction runs);

the writer threads' CPU per span by the work it went to, and how many commits or jobs that took
(``writer_cpu_microseconds`` and ``writer_runs`` on each replica's ``/metrics``: ingest commits,
sessions, following other replicas' traces, shipping) and what one of them cost;
and, once, the report's queries on the lake against the same queries on the one replica's own
file (the single-process store with the same rows). The machine's load average is printed beside
the figures: on a shared machine they move with it.

By hand, from the repository root, with the lake environment made (``.ci/run`` does it):

    python bench/lake.py                         # 1, 2, 3 replicas, 3,000 spans/s for 20 s
    python bench/lake.py --replicas 3 --rate 5000 --seconds 60
    python bench/lake.py --replicas 1 --split 3 --no-batch   # one replica taking the smaller requests three would get
    python bench/lake.py --rounds 3                # 1, 2, 3, 1, 2, 3, ...: medians, less at the mercy of the machine
    POLL=1 python bench/lake.py                    # owners polling every second (default: as often as replicas ship)
    SHIP=5 python bench/lake.py                    # store.lake.ship_interval_seconds (default 10; polls follow it)
    python bench/lake.py --turns 5 --active 1500   # 5-turn sessions, all in flight: a turn goes idle before the next
    JOB_WAIT=0 python bench/lake.py                # idle traces assembled at once (default: up to a ship interval
                                                   # waiting for sessions.min_traces_per_job of them)
    CACHE_MB=256 python bench/lake.py --turns 5 --active 1500   # sessions.max_assembled_cache_bytes (default 256 MiB)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from conftest import ServerProcess  # noqa: E402
from lake_support import (Postgres, free_port, go_seconds, lake_config, lake_maintenance, lake_python,  # noqa: E402
                          lake_rows, pg_bindir, split)
from payloads import genai_request  # noqa: E402
from agentfunnel.collector.config import LakeSettings  # noqa: E402
from sessions_payloads import session_streams  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

SPANS_PER_REQUEST = 512
SHIP_DEFAULT = LakeSettings.model_fields["ship_interval_seconds"].default
SHIPPING = {"ship_interval_seconds": float(os.environ.get("SHIP", SHIP_DEFAULT)), "ship_batch_rows": 200_000,
            "compact_interval_seconds": 0,
            "poll_interval_seconds": float(os.environ["POLL"]) if os.environ.get("POLL") else None}  # None: the default
SESSIONS = {"idle_timeout_seconds": 2.0, "check_interval_seconds": 1.0,  # the default check interval, a short idle time
            "max_job_wait_seconds": float(os.environ["JOB_WAIT"]) if os.environ.get("JOB_WAIT") else None,
            **({"max_assembled_cache_bytes": int(float(os.environ["CACHE_MB"]) * 2**20)} if os.environ.get("CACHE_MB")
               else {})}
TURN_SPANS = 9  # sessions_payloads: an invoke_agent span over four chat and four execute_tool spans
STORE = {"threads": 1}  # up to three replicas and PostgreSQL share two cores here: one DuckDB thread each, for every N


def post(url: str, body: bytes, give_up_after: float = 300.0) -> None:
    deadline = time.monotonic() + give_up_after
    while True:
        req = urllib.request.Request(url + "/v1/traces", data=body, method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                if resp.status == 200:
                    return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} has not taken a request for {give_up_after:g} s: {exc}") from None
        time.sleep(0.05)  # pushed back: retry


def cpu_seconds(pids: list[int], postmaster: int) -> tuple[float, float]:
    """(replicas, PostgreSQL) CPU-seconds so far; a backend that exited is in the postmaster's children times."""
    replicas = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        replicas += t.user + t.system
    pm = psutil.Process(postmaster)
    t = pm.cpu_times()
    pg = t.user + t.system + t.children_user + t.children_system
    for child in pm.children(recursive=True):
        try:
            c = child.cpu_times()
            pg += c.user + c.system
        except psutil.NoSuchProcess:  # exited between the listing and the read: now in children_*
            pass
    return replicas, pg


def writer_work(servers: list[ServerProcess]) -> dict[str, tuple[float, int]]:
    """Writer (CPU-seconds, runs) by work so far, summed over the replicas (``writer_cpu_microseconds``,
    ``writer_runs``: group commits and jobs)."""
    out: dict[str, tuple[float, int]] = {}
    for s in servers:
        with urllib.request.urlopen(s.admin + "/metrics?format=json", timeout=60) as resp:
            doc = json.loads(resp.read())
        runs = doc.get("writer_runs", {})
        for work, us in doc.get("writer_cpu_microseconds", {}).items():
            seconds, n = out.get(work, (0.0, 0))
            out[work] = (seconds + us / 1e6, n + runs.get(work, 0))
    return out


def pg_commits(pg: Postgres, db: str) -> int:
    out = subprocess.run([str(pg.bindir / "psql"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "agentfunnel", "-d", db,
                          "-Atc", "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


_REPORT_TIMES = """
import json, statistics, sys, time
from pathlib import Path
from agentfunnel.collector.config import load_settings
from agentfunnel.collector.report import Filters, load_report
store = load_settings(Path(sys.argv[1])).store
def best(db):
    load_report(db, Filters())  # warm: the lake attached once per process, files cached
    times = []
    for _ in range(5):
        t = time.perf_counter()
        load_report(db, Filters())
        times.append(time.perf_counter() - t)
    return statistics.median(times)
print(json.dumps({"lake": best(store), "file": best(Path(sys.argv[2]))}))
"""


@dataclass
class Run:
    replicas: int
    spans: int
    seconds: float
    cpu_replicas: float
    cpu_pg: float
    snapshots: int
    pg_commits: int
    files_before: int
    files_after: int
    load: tuple[float, float, float]
    writer: dict[str, tuple[float, int]]  # writer (CPU-seconds, runs) by work, over every replica

    @property
    def writer_per_span(self) -> str:
        return ", ".join(f"{work} {seconds / self.spans * 1e6:.0f} ({n} runs, {seconds / max(n, 1) * 1e3:.1f} ms each)"
                         for work, (seconds, n) in
                         sorted(self.writer.items(), key=lambda kv: -kv[1][0]) if seconds / self.spans >= 0.5e-6)

    @property
    def cpu_per_span(self) -> float:
        return (self.cpu_replicas + self.cpu_pg) / self.spans


def offered(rate: float, seconds: float, turns: int, active: int) -> list[ExportTraceServiceRequest]:
    """The requests offered, in the order they go: ``payloads.genai_request`` (one trace per conversation), or with
    ``turns`` > 1 the agent sessions of ``ingest.py --sessions`` (one agent process working ``active``
    conversations at once; a turn is its own trace, so with enough of them in flight a turn goes idle before
    the next one of its conversation arrives, and its session is scored again from the turns before)."""
    if turns <= 1:
        return [genai_request(SPANS_PER_REQUEST, seed=k) for k in range(max(1, round(rate * seconds / SPANS_PER_REQUEST)))]
    count = max(1, round(rate * seconds / (TURN_SPANS * turns)))
    stream = session_streams(count, turns, 1, SPANS_PER_REQUEST, active=active).bodies[0]
    return [ExportTraceServiceRequest.FromString(body) for body in stream]


def span_count(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def collector_batching(path: Path = HERE.parent / "deploy" / "otelcol.yaml") -> tuple[int, float]:
    """(min_size, flush_timeout seconds) of the Collector's batch per replica, as ``deploy/otelcol.yaml`` sets it."""
    import yaml

    otlp = yaml.safe_load(path.read_text())["exporters"]["loadbalancing"]["protocol"]["otlp"]
    batch = otlp["sending_queue"]["batch"]
    assert batch["sizer"] == "items", batch
    return int(batch["min_size"]), go_seconds(batch["flush_timeout"])


def batched(parts: list[tuple[float, ExportTraceServiceRequest, int]], min_spans: int, flush_seconds: float
            ) -> list[tuple[float, ExportTraceServiceRequest, int]]:
    """One replica's shares (when, request, spans), in order, as the Collector's batcher for that replica sends
    them: merged until they hold ``min_spans``, or sent ``flush_seconds`` after the first one arrived."""
    out: list[tuple[float, ExportTraceServiceRequest, int]] = []
    merged, started, n = ExportTraceServiceRequest(), 0.0, 0
    for when, part, spans in parts:
        if n and when >= started + flush_seconds:
            out.append((started + flush_seconds, merged, n))
            merged, n = ExportTraceServiceRequest(), 0
        if not n:
            started = when
        merged.MergeFrom(part)
        n += spans
        if n >= min_spans:
            out.append((when, merged, n))
            merged, n = ExportTraceServiceRequest(), 0
    if n:
        out.append((started + flush_seconds, merged, n))
    return out


def run(pg: Postgres, python: str, replicas: int, rate: float, seconds: float, clients: int,
        keep: list[Path], shares: int | None = None, turns: int = 1, active: int = 128,
        batching: tuple[int, float] | None = None) -> Run:
    tmp = Path(tempfile.mkdtemp(prefix="agentfunnel-lakebench-"))
    db = f"bench_{replicas}_{int(time.time())}"
    catalog = pg.createdb(db)
    configs = [lake_config(tmp / f"r{i}.yaml", catalog, tmp / "data", i, replicas, SHIPPING, STORE, **SESSIONS)
               for i in range(replicas)]
    servers = [ServerProcess(c.with_suffix(".duckdb"), ["--config", str(c), "--grpc-port", str(free_port())],
                             python=python) for c in configs]
    threads = [threading.Thread(target=s.start, kwargs={"timeout": 120}) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shares_of: list[list[tuple[float, ExportTraceServiceRequest, int]]] = [[] for _ in range(replicas)]
    sent_before = 0
    for request in offered(rate, seconds, turns, active):
        for share, part in split(request, shares or replicas).items():
            shares_of[share % replicas].append((sent_before / rate, part, span_count(part)))
        sent_before += span_count(request)
    work = sorted((when, i, part.SerializeToString(), n)  # (when, replica, body, spans)
                  for i, parts in enumerate(shares_of)
                  for when, part, n in (batched(parts, *batching) if batching else parts))
    postmaster = int((pg.root / "data" / "postmaster.pid").read_text().split()[0])
    pids = [s.proc.pid for s in servers]  # type: ignore[union-attr]
    try:
        time.sleep(2.0)  # start-up work (migrations, views) settles first
        before = cpu_seconds(pids, postmaster), pg_commits(pg, db), lake_maintenance(python, configs[0])["snapshot"]
        writer_before = writer_work(servers)
        t0 = time.perf_counter()

        def send(item: tuple[float, int, bytes, int]) -> None:
            wait = t0 + item[0] - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            post(servers[item[1]].http_url, item[2])

        with concurrent.futures.ThreadPoolExecutor(max_workers=clients * replicas) as pool:
            list(pool.map(send, work))
        for _ in range(2):  # everything assembled, scored and shipped; a second round for the owners' polls
            for s in servers:
                s.admin_post("/flush", timeout=600)
        elapsed = time.perf_counter() - t0
        after = cpu_seconds(pids, postmaster), pg_commits(pg, db)
        writer = {w: (t - writer_before.get(w, (0.0, 0))[0], n - writer_before.get(w, (0.0, 0))[1])
                  for w, (t, n) in writer_work(servers).items()}
        facts = lake_maintenance(python, configs[0], "compact")
        sent = sum(w[3] for w in work)
        stored = lake_rows(python, configs[0], {"n": "SELECT count(*) AS n FROM spans"})["n"][0]["n"]
        assert stored == sent, (stored, sent)
        return Run(replicas, sent, elapsed, after[0][0] - before[0][0], after[0][1] - before[0][1],
                   facts["snapshot"] - before[2], after[1] - before[1], facts["files"], facts["files_after"],
                   os.getloadavg(), writer)
    finally:
        for s in servers:
            s.stop()
        if replicas == 1 and not keep:  # the report is timed on it at the end
            keep.extend([configs[0], configs[0].with_suffix(".duckdb")])
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, nargs="*", default=[1, 2, 3])
    ap.add_argument("--rate", type=float, default=3000.0, help="offered spans per second, for every N")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the load is offered")
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients per replica")
    ap.add_argument("--split", type=int, default=None, help="cut each request into this many shares by trace id "
                    "(default: one per replica); --replicas 1 --split 3 sends one replica what three would take")
    ap.add_argument("--turns", type=int, default=1, help="turns per conversation, each its own trace (default 1: "
                    "payloads.genai_request; more: the agent sessions of ingest.py --sessions)")
    ap.add_argument("--active", type=int, default=128, help="with --turns: conversations the agent works at once "
                    "(more spreads a conversation's turns further apart)")
    ap.add_argument("--no-batch", action="store_true", help="send each replica its share of every request as it "
                    "comes (default: merged as the Collector's per-replica batch in deploy/otelcol.yaml does)")
    ap.add_argument("--rounds", type=int, default=1, help="run the --replicas list this many times, interleaved, "
                    "and print each N's median")
    args = ap.parse_args()
    python, why = lake_python()
    bindir = pg_bindir()
    if python is None or bindir is None:
        print(why or "no PostgreSQL server binaries", file=sys.stderr)
        return 2
    pg = Postgres(bindir).start()
    keep: list[Path] = []
    runs: list[Run] = []
    try:
        shape = f"; sessions of {args.turns} turns, {args.active} at once" if args.turns > 1 else ""
        batching = collector_batching()
        sent = "each replica's share of every request as it comes" if args.no_batch else \
            f"merged per replica up to {batching[0]} spans or {batching[1]:g} s"
        print(f"offered load: {args.rate:,.0f} spans/s for {args.seconds:g} s{shape}, {sent}; {os.cpu_count()} CPUs",
              flush=True)
        for n in args.replicas * args.rounds:
            r = run(pg, python, n, args.rate, args.seconds, args.clients, keep, args.split, args.turns, args.active,
                    None if args.no_batch else batching)
            runs.append(r)
            base = runs[0].cpu_per_span if runs[0].replicas == 1 and len(runs) <= len(args.replicas) else None
            ratio = f", {r.cpu_per_span / base:.2f}x one replica's" if base else ""
            per_m = 1e6 / r.spans
            cut = f" (requests cut in {args.split})" if args.split else ""
            print(f"{n} replica(s){cut}: {r.spans} spans in {r.seconds:.1f} s ({r.spans / r.seconds:,.0f}/s); "
                  f"CPU {r.cpu_replicas:.1f} s replicas + {r.cpu_pg:.1f} s PostgreSQL = "
                  f"{r.cpu_per_span * 1e6:.0f} us/span{ratio}; catalog: {r.snapshots * per_m:,.0f} DuckLake "
                  f"commits and {r.pg_commits * per_m:,.0f} PostgreSQL transactions per million spans; Parquet "
                  f"files per million spans {r.files_before * per_m:,.0f} before compaction, "
                  f"{r.files_after * per_m:,.0f} after; load average {' '.join(f'{x:.1f}' for x in r.load)}; "
                  f"writer us/span by work: {r.writer_per_span}", flush=True)
        if args.rounds > 1:
            medians = {n: statistics.median(r.cpu_per_span for r in runs if r.replicas == n) for n in args.replicas}
            one = medians.get(1)
            print("medians over " + str(args.rounds) + " rounds: " + "; ".join(
                f"{n} replica(s) {m * 1e6:.0f} us/span" + (f", {m / one:.2f}x" if one else "")
                for n, m in medians.items()), flush=True)
        if keep:
            out = subprocess.run([python, "-c", _REPORT_TIMES, str(keep[0]), str(keep[1])], capture_output=True,
                                 text=True, timeout=600)
            if out.returncode == 0:
                t = json.loads(out.stdout)
                print(f"report queries: {t['lake'] * 1000:.0f} ms on the lake, {t['file'] * 1000:.0f} ms on the "
                      f"replica's own file ({t['lake'] / t['file']:.2f}x); load average "
                      f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
            else:
                print(f"report timing failed: {out.stderr[-2000:]}", file=sys.stderr)
    finally:
        pg.stop()
        if keep:
            shutil.rmtree(keep[0].parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
