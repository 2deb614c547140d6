"""End-to-end ingest throughput of ``agentfunnel serve``, next to a parse-and-count reference.

What it measures: spans per second that a real ``agentfunnel serve`` process acknowledges over
loopback, where a request counts only once its response has arrived (the server answers only
after the spans are committed to DuckDB). The same prebuilt GenAI-shaped requests (512 spans
each, distinct span ids) are sent by C concurrent clients in this process, over OTLP/gRPC (raw
unary Export calls, one channel per client) and OTLP/HTTP (protobuf POSTs, one keep-alive
connection per client). Each transport gets its own server on a fresh temporary database, so
both runs start from an empty file; afterwards the stored row count is checked through
``agentfunnel sql`` against the spans sent.

The same clients then drive a reference server, run in a separate process by this script
(``--reference-server``): it only parses each body with ``ExportTraceServiceRequest.FromString``,
counts the spans and answers an empty response. The ratio agentfunnel / reference says how much
of the ceiling of a Python OTLP server the full pipeline (decode, group commit) keeps. Server CPU
time is sampled with psutil around the timed window, giving spans per CPU-second (per core used).
Push-backs (HTTP 503 / gRPC UNAVAILABLE) are retried after a short sleep and counted.

This is a by-hand benchmark, never part of the test suite. Run it from the repository root:

    python bench/ingest.py                          # 400 requests (~200k spans), 4 clients, both transports
    python bench/ingest.py --requests 200 --concurrency 8 --transport grpc --keep
    python bench/ingest.py --sessions --no-reference  # 3,360 two-turn sessions, acknowledged and end to end
    python bench/ingest.py --sessions --turns 50 --session-count 20 --transport grpc --no-reference

``--sessions`` sends agent sessions instead (``sessions_payloads.py``: each turn a trace of an
``invoke_agent`` span over four ``chat`` and four ``execute_tool`` spans of a shopping funnel), each
client an agent process sending its own requests in order, so a session's next turn goes out after
every request of the one before. The server runs with ``sessions.idle_timeout_seconds: 1`` and
``check_interval_seconds: 0.2``. Two clocks: "acknowledged" stops at the last acknowledgement,
"end to end" when every session's row is written with status closed and all its turns (polled
through the server's SQL endpoint every ``--poll-interval`` seconds once its metrics show no open trace and no
job waiting, from the last acknowledgement
on). Server CPU (from /proc) is read at both points, so the CPU between them is the session stage
catching up; the peak RSS is the server's VmHWM.

BENCH_SERVER_WRAPPER="py-spy record -o prof.svg --" runs the agentfunnel server under a profiler
(its CPU figures then count the wrapper, not the server).
"""

from __future__ import annotations

import argparse
import atexit
import http.client
import json
import os
import platform
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
EXPORT_METHOD = f"/{TRACE_SERVICE}/Export"
SPANS_PER_REQUEST = 512
MAX_MESSAGE = 64 * 1024 * 1024
CALL_TIMEOUT = 120.0          # one request, server side included
PUSHBACK_DEADLINE = 300.0     # give up on a request pushed back for this long
WARMUP_PER_CLIENT = 1         # untimed requests per client before the clock starts (own span ids)
AF_READY = re.compile(r"agentfunnel serving db=(\S+) grpc=(\S+) http=(\S+) sql=(\S+)")
REF_READY = re.compile(r"reference serving grpc=(\S+) http=(\S+)")


# ============================================================================ reference server


def reference_server() -> int:
    """Parse and count, nothing else: gRPC and HTTP on free loopback ports, one asyncio loop."""
    import asyncio

    import grpc
    from aiohttp import web
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                          ExportTraceServiceResponse)

    empty = ExportTraceServiceResponse().SerializeToString()
    counts = {"requests": 0, "spans": 0}

    def count(body: bytes) -> None:
        req = ExportTraceServiceRequest.FromString(body)
        counts["spans"] += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        counts["requests"] += 1

    async def grpc_export(body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        count(body)
        return empty

    async def http_export(request: web.Request) -> web.Response:
        count(await request.read())
        return web.Response(body=empty, content_type="application/x-protobuf")

    async def http_count(request: web.Request) -> web.Response:
        return web.json_response(counts)

    async def main() -> None:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                                          ("grpc.max_send_message_length", MAX_MESSAGE)])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            TRACE_SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(grpc_export)}),))
        grpc_port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        app = web.Application(client_max_size=MAX_MESSAGE)
        app.router.add_post("/v1/traces", http_export)
        app.router.add_get("/count", http_count)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(f"reference serving grpc=127.0.0.1:{grpc_port} http=127.0.0.1:{http_port}", flush=True)
        await stop.wait()
        await server.stop(1)
        await runner.cleanup()

    asyncio.run(main())
    return 0


# ============================================================================ child processes


class Child:
    """A server process: started, waited for its ready line, always stopped (see ``cleanup``)."""

    running: list["Child"] = []

    def __init__(self, name: str, cmd: list[str], ready: re.Pattern[str], log_path: Path) -> None:
        self.name = name
        self.cmd = cmd
        self.ready = ready
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()

    def start(self, timeout: float = 60.0) -> re.Match[str]:
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        Child.running.append(self)
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                break
            m = self.ready.search(line)
            if m:
                return m
        self.stop()
        raise RuntimeError(f"{self.name} did not start:\n{self.logs()[-3000:]}")

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def cpu_seconds(self) -> float:
        import psutil

        assert self.proc is not None
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self in Child.running:
            Child.running.remove(self)
        return self.proc.returncode

    def logs(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    @classmethod
    def cleanup(cls) -> None:
        for child in list(cls.running):
            child.stop(timeout=10.0)


# ============================================================================ clients


class Sender:
    """One client's connection; ``send`` returns rejected spans, or None when pushed back."""

    def send(self, body: bytes) -> int | None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _rejected(response: bytes) -> int:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    return ExportTraceServiceResponse.FromString(response).partial_success.rejected_spans


class GrpcSender(Sender):
    def __init__(self, addr: str) -> None:
        import grpc

        self._grpc = grpc
        # A local subchannel pool gives each client its own HTTP/2 connection.
        self.channel = grpc.insecure_channel(addr, options=[
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.use_local_subchannel_pool", 1),
        ])
        self.call = self.channel.unary_unary(EXPORT_METHOD)  # no (de)serializers: bytes in, bytes out
        grpc.channel_ready_future(self.channel).result(timeout=30)

    def send(self, body: bytes) -> int | None:
        try:
            return _rejected(self.call(body, timeout=CALL_TIMEOUT))
        except self._grpc.RpcError as exc:
            if exc.code() == self._grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                return None
            raise RuntimeError(f"gRPC {exc.code().name}: {exc.details()}") from None  # type: ignore[attr-defined]

    def close(self) -> None:
        self.channel.close()


class HttpSender(Sender):
    def __init__(self, addr: str) -> None:
        host, port = addr.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=CALL_TIMEOUT)  # HTTP/1.1 keep-alive

    def send(self, body: bytes) -> int | None:
        self.conn.request("POST", "/v1/traces", body=body, headers={"Content-Type": "application/x-protobuf"})
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status == 200:
            return _rejected(data)
        if resp.status == 503:
            return None
        raise RuntimeError(f"HTTP {resp.status}: {data[:300]!r}")

    def close(self) -> None:
        self.conn.close()


SENDERS: dict[str, Callable[[str], Sender]] = {"grpc": GrpcSender, "http": HttpSender}


@dataclass
class Drive:
    """What the clients saw during the timed window."""

    requests: int = 0
    spans: int = 0
    seconds: float = 0.0
    pushbacks: int = 0
    rejected: int = 0
    latencies: list[float] = field(default_factory=list)
    server_cpu: float = 0.0
    client_cpu: float = 0.0


def deliver_until_taken(sender: "Sender", body: bytes, retry_sleep: float, failed: list) -> tuple[int, int]:
    """Send one body until the server takes it: (push-backs, spans rejected); gives up past PUSHBACK_DEADLINE."""
    pushed = 0
    deadline = time.monotonic() + PUSHBACK_DEADLINE
    while True:
        rejected = sender.send(body)
        if rejected is not None:
            return pushed, rejected
        pushed += 1
        if failed or time.monotonic() > deadline:
            raise RuntimeError(f"request still pushed back after {pushed} tries")
        time.sleep(retry_sleep)


def drive(transport: str, addr: str, bodies: list[bytes], warmup: list[bytes], concurrency: int,
          retry_sleep: float, server: Child) -> Drive:
    """Warm each client up, then send every body once with ``concurrency`` clients (dealt out in turn); time to last ack."""
    return drive_streams(transport, addr, [bodies[k::concurrency] for k in range(concurrency)],
                         len(bodies) * SPANS_PER_REQUEST, [warmup[k::concurrency] for k in range(concurrency)],
                         retry_sleep, server)


# ============================================================================ runs


@dataclass
class Run:
    server: str               # "agentfunnel" or "reference"
    transport: str
    drive: Drive
    stored: int               # spans the server says it has, after the run
    expected: int             # spans sent, warm-up included
    metrics: dict[str, Any] | None = None
    db: Path | None = None

    @property
    def rate(self) -> float:
        return self.drive.spans / self.drive.seconds if self.drive.seconds else 0.0

    @property
    def per_core(self) -> float:
        return self.drive.spans / self.drive.server_cpu if self.drive.server_cpu else float("nan")

    @property
    def cores(self) -> float:
        return self.drive.server_cpu / self.drive.seconds if self.drive.seconds else 0.0


def agentfunnel_cmd(wrap: bool = False) -> list[str]:
    """The CLI; the server itself under BENCH_SERVER_WRAPPER (e.g. a profiler command) when set."""
    prefix = os.environ.get("BENCH_SERVER_WRAPPER", "").split() if wrap else []
    return prefix + [sys.executable, "-m", "agentfunnel.collector.cli"]


def sql_rows(db: Path, query: str) -> list[dict[str, Any]]:
    """A query's rows through the real CLI (through the running server when one owns the file)."""
    proc = subprocess.run(agentfunnel_cmd() + ["sql", "--db", str(db), "--format", "json", query],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"agentfunnel sql failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def stored_spans(db: Path) -> int:
    """``select count(*)`` through the real CLI: the running server owns the file."""
    return int(sql_rows(db, "select count(*) as n from spans")[0]["n"])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def run_agentfunnel(transport: str, bodies: list[bytes], warmup: list[bytes], args: argparse.Namespace,
                    workdir: Path, say: Callable[[str], None]) -> Run:
    db = workdir / f"agentfunnel-{transport}.duckdb"
    child = Child(f"agentfunnel serve ({transport})",
                  agentfunnel_cmd(wrap=True) + ["serve", "--db", str(db), "--grpc-port", "0", "--http-port", "0"]
                  + (["--config", str(args.config)] if args.config else []),
                  AF_READY, workdir / f"agentfunnel-{transport}.log")
    m = child.start()
    _, grpc_addr, http_addr, _ = m.groups()
    try:
        d = drive(transport, grpc_addr if transport == "grpc" else http_addr, bodies, warmup,
                  args.concurrency, args.retry_sleep, child)
        expected = (len(bodies) + len(warmup)) * SPANS_PER_REQUEST
        stored = stored_spans(db)
        metrics = get_json(f"http://{http_addr}/metrics?format=json")
    except Exception:
        say(f"[red]agentfunnel ({transport}) log tail:[/]\n{child.logs()[-3000:]}")
        raise
    finally:
        rc = child.stop()
    if rc != 0:
        say(f"[yellow]agentfunnel serve ({transport}) exited with {rc}[/]\n{child.logs()[-2000:]}")
    return Run("agentfunnel", transport, d, stored, expected, metrics, db)


def run_reference(transport: str, bodies: list[bytes], warmup: list[bytes], args: argparse.Namespace,
                  workdir: Path, say: Callable[[str], None]) -> Run:
    child = Child(f"reference ({transport})", [sys.executable, str(Path(__file__).resolve()), "--reference-server"],
                  REF_READY, workdir / f"reference-{transport}.log")
    grpc_addr, http_addr = child.start().groups()
    try:
        d = drive(transport, grpc_addr if transport == "grpc" else http_addr, bodies, warmup,
                  args.concurrency, args.retry_sleep, child)
        stored = int(get_json(f"http://{http_addr}/count")["spans"])
    except Exception:
        say(f"[red]reference ({transport}) log tail:[/]\n{child.logs()[-3000:]}")
        raise
    finally:
        child.stop()
    return Run("reference", transport, d, stored, (len(bodies) + len(warmup)) * SPANS_PER_REQUEST)


# ============================================================================ report


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _flatten(metrics: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in metrics.items():
        if isinstance(value, dict):
            for label, v in value.items():
                flat[f"{name}{{{label}}}"] = v
        else:
            flat[name] = value
    return flat


def report(console: Any, runs: list[Run], args: argparse.Namespace, machine: dict[str, str]) -> None:
    from rich.table import Table

    by = {(r.server, r.transport): r for r in runs}
    transports = [t for t in ("grpc", "http") if ("agentfunnel", t) in by]

    t = Table(title=f"Ingest over loopback: {args.requests} requests × {SPANS_PER_REQUEST} spans, "
                    f"{args.concurrency} clients", title_justify="left",
              caption="spans/s: acknowledged (committed) spans over the timed window; ratio = agentfunnel / "
                      "reference; spans/s/core = spans / server CPU-seconds; cores = server CPU-seconds / wall "
                      "seconds", caption_justify="left")
    for col in ("transport", "agentfunnel spans/s", "reference spans/s", "ratio", "push-backs",
                "agentfunnel spans/s/core", "reference spans/s/core", "agentfunnel cores", "count check"):
        t.add_column(col, justify="left" if col in ("transport", "count check") else "right")
    for tr in transports:
        af, ref = by[("agentfunnel", tr)], by.get(("reference", tr))
        ok = [r.stored == r.expected for r in (af, ref) if r]
        t.add_row(
            tr,
            f"{af.rate:,.0f}",
            f"{ref.rate:,.0f}" if ref else "-",
            f"{af.rate / ref.rate:.2f}" if ref and ref.rate else "-",
            f"{af.drive.pushbacks}" + (f" (ref {ref.drive.pushbacks})" if ref else ""),
            f"{af.per_core:,.0f}",
            f"{ref.per_core:,.0f}" if ref else "-",
            f"{af.cores:.2f}",
            "[green]ok[/]" if all(ok) else "[red]MISMATCH[/]",
        )
    console.print(t)

    d = Table(title="Per run (timed window; stored spans include the untimed warm-up requests)",
              title_justify="left")
    for col in ("server", "transport", "requests", "spans", "wall s", "spans/s", "push-backs", "rejected",
                "server CPU s", "server cores", "client cores", "p50 ms", "p99 ms", "stored spans"):
        d.add_column(col, justify="left" if col in ("server", "transport") else "right")
    for r in runs:
        x = r.drive
        d.add_row(r.server, r.transport, str(x.requests), f"{x.spans:,}", f"{x.seconds:.2f}", f"{r.rate:,.0f}",
                  str(x.pushbacks), str(x.rejected), f"{x.server_cpu:.2f}", f"{r.cores:.2f}",
                  f"{x.client_cpu / x.seconds if x.seconds else 0:.2f}",
                  f"{_pct(x.latencies, 0.5) * 1000:.1f}", f"{_pct(x.latencies, 0.99) * 1000:.1f}",
                  f"{r.stored:,}" if r.stored == r.expected else f"[red]{r.stored:,} ≠ {r.expected:,} sent[/]")
    console.print(d)

    mt = Table(title="Machine", title_justify="left", show_header=False)
    mt.add_column("fact")
    mt.add_column("value")
    for k, v in machine.items():
        mt.add_row(k, v)
    console.print(mt)

    af_runs = [r for r in runs if r.server == "agentfunnel" and r.metrics]
    if af_runs:
        flats = [_flatten(r.metrics or {}) for r in af_runs]
        keys = sorted({k for f in flats for k in f})
        m = Table(title="agentfunnel /metrics?format=json at the end of each run", title_justify="left")
        m.add_column("metric")
        for r in af_runs:
            m.add_column(f"{r.transport} server", justify="right")
        for k in keys:
            m.add_row(k, *[str(f.get(k, "")) for f in flats])
        console.print(m)


def machine_facts() -> dict[str, str]:
    import aiohttp
    import duckdb
    import grpc
    from google.protobuf.internal import api_implementation

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    return {
        "nproc (usable / online)": f"{usable} / {os.cpu_count()}",
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "grpcio / aiohttp / duckdb": f"{grpc.__version__} / {aiohttp.__version__} / {duckdb.__version__}",
        "protobuf backend": api_implementation.Type(),
    }


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


# ============================================================================ sessions mode


SESSION_PREFIX = "bench"   # the timed sessions' ids start with this; the warm-up's with "warm"
SPANS_PER_TURN = 9         # sessions_payloads.SPANS_PER_TURN: an invoke_agent span, four chat, four execute_tool


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process in bytes, from /proc/<pid>/status; {} if unreadable."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc/<pid>/stat (its threads included, its children not)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    t: float                  # seconds since the clock started
    rss: int
    open_traces: float
    jobs_waiting: float
    traces_assembled: float


class Sampler:
    """Every ``interval`` seconds: the server's RSS (/proc, free) and three /metrics numbers (one GET)."""

    def __init__(self, pid: int, metrics_url: str, t0: float, interval: float = 0.5) -> None:
        self.pid, self.url, self.t0, self.interval = pid, metrics_url, t0, interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                m = get_json(self.url)
            except Exception:  # noqa: BLE001 - a missed sample is not a failure
                continue
            self.samples.append(Sample(time.perf_counter() - self.t0, proc_status(self.pid).get("VmRSS", 0),
                                       m.get("open_traces", 0), m.get("jobs_waiting", 0),
                                       m.get("traces_assembled", 0)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass
class SessionRun:
    server: str
    transport: str
    drive: Drive
    stored: int
    expected: int
    sessions_expected: int
    ack_seconds: float = 0.0          # clock start → last acknowledgement
    end_seconds: float = 0.0          # clock start → every session closed with all its turns (the poll that saw it)
    cpu_ack: float = 0.0              # server CPU-seconds in the acknowledged phase
    cpu_catchup: float = 0.0          # server CPU-seconds from the last acknowledgement to the end
    sessions_closed: int = 0
    polls: int = 0
    last_update_seconds: float | None = None   # clock start → the newest row's updated_at (its scoring job's start)
    rss_peak: int = 0
    rss_at_ack: int = 0
    metrics_ack: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    timed_out: bool = False

    @property
    def spans(self) -> int:
        return self.drive.spans

    @property
    def ok(self) -> bool:
        if self.server == "reference":
            return self.stored == self.expected
        return self.stored == self.expected and self.sessions_closed == self.sessions_expected and not self.timed_out


def drive_streams(transport: str, addr: str, streams: list[list[bytes]], spans: int, warmup: list[list[bytes]],
                  retry_sleep: float, server: Child, after_warmup: Callable[[], None] | None = None,
                  on_start: Callable[[float], None] | None = None) -> Drive:
    """Client k sends ``warmup[k]`` then, once every client has and ``after_warmup`` returned, ``streams[k]``.

    Each client sends its own requests in order, the next once the previous is acknowledged
    (an agent process's exporter); the clock runs from the common start to the last acknowledgement.
    """
    import psutil

    me = psutil.Process()
    n = len(streams)
    warmed = threading.Barrier(n + 1)
    start = threading.Barrier(n + 1)
    lock = threading.Lock()
    failed: list[BaseException] = []
    out = Drive()
    ends: list[float] = []

    def deliver(sender: Sender, body: bytes) -> tuple[int, int]:
        return deliver_until_taken(sender, body, retry_sleep, failed)

    def client(k: int) -> None:
        sender: Sender | None = None
        lat: list[float] = []
        pushed = rejected = 0
        try:
            sender = SENDERS[transport](addr)
            for body in warmup[k] if k < len(warmup) else []:
                deliver(sender, body)
            warmed.wait()
            start.wait()
            for body in streams[k]:
                if failed:
                    break
                t0 = time.perf_counter()
                p, r = deliver(sender, body)
                lat.append(time.perf_counter() - t0)
                pushed += p
                rejected += r
            end = time.perf_counter()
        except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
            failed.append(exc)
            warmed.abort()
            start.abort()
            return
        finally:
            if sender is not None:
                sender.close()
        with lock:
            out.latencies.extend(lat)
            out.requests += len(lat)
            out.pushbacks += pushed
            out.rejected += rejected
            ends.append(end)

    threads = [threading.Thread(target=client, args=(k,), name=f"client-{k}", daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    try:
        warmed.wait(timeout=300)
        if after_warmup is not None:
            after_warmup()
        start.wait(timeout=60)
    except threading.BrokenBarrierError:
        pass
    except BaseException:
        failed.append(RuntimeError("warm-up wait failed"))
        start.abort()
        raise
    cpu0, me0 = server.cpu_seconds(), me.cpu_times()
    t0 = time.perf_counter()
    if on_start is not None:
        on_start(t0)
    for t in threads:
        t.join()
    if failed:
        raise RuntimeError(f"{transport} client failed: {failed[0]!r}") from failed[0]
    cpu1, me1 = server.cpu_seconds(), me.cpu_times()
    out.seconds = max(ends) - t0
    out.spans = spans if not failed else 0
    out.server_cpu = cpu1 - cpu0
    out.client_cpu = (me1.user + me1.system) - (me0.user + me0.system)
    return out


def sessions_config(args: argparse.Namespace, workdir: Path) -> Path:
    """The user's --config (if any) with the session stage's timers set for the benchmark, as YAML."""
    import tomllib

    import yaml

    data: dict[str, Any] = {}
    if args.config:
        text = Path(args.config).read_text()
        data = tomllib.loads(text) if str(args.config).endswith(".toml") else (yaml.safe_load(text) or {})
    data.setdefault("sessions", {})
    data["sessions"]["idle_timeout_seconds"] = 1
    data["sessions"]["check_interval_seconds"] = 0.2
    path = workdir / "sessions-bench.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _count_sql(turns: int) -> str:
    return (f"select count(*) from sessions where status = 'closed' and trace_count = {turns} "
            f"and starts_with(session_id, '{SESSION_PREFIX}-')")


def wait_quiet(metrics_url: str, traces: int, timeout: float = 120.0) -> None:
    """Until the warm-up's traces are assembled and no session work is left (so the clock starts clean)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = get_json(metrics_url)
        if m.get("traces_assembled", 0) >= traces and not m.get("open_traces") and not m.get("jobs_waiting"):
            time.sleep(0.3)  # let the last job's commit and any open-session refresh settle
            return
        time.sleep(0.2)
    raise RuntimeError(f"warm-up sessions still pending after {timeout:.0f}s")


def run_sessions_agentfunnel(transport: str, streams: Any, warm: Any, config: Path, args: argparse.Namespace,
                             workdir: Path, say: Callable[[str], None]) -> SessionRun:
    from agentfunnel.collector.query import QueryError, query

    db = workdir / f"sessions-{transport}.duckdb"
    if args.stored_traces:
        from grown_store import grown_store
        started = time.perf_counter()
        grown_store(db, args.stored_traces)
        say(f"the store starts with {args.stored_traces:,} older traces indexed ({time.perf_counter() - started:.1f}s)")
    child = Child(f"agentfunnel serve ({transport}, sessions)",
                  agentfunnel_cmd(wrap=True) + ["serve", "--db", str(db), "--grpc-port", "0", "--http-port", "0",
                                                "--config", str(config)],
                  AF_READY, workdir / f"sessions-{transport}.log")
    m = child.start()
    _, grpc_addr, http_addr, admin = m.groups()
    metrics_url = f"{admin}/metrics"
    assert child.proc is not None
    pid = child.proc.pid
    warm_traces = warm.spans // SPANS_PER_TURN
    clock: dict[str, Any] = {}

    def on_start(t0: float) -> None:
        clock["t0"], clock["wall0"] = t0, time.time()
        clock["sampler"] = Sampler(pid, metrics_url, t0).start()

    run = SessionRun("agentfunnel", transport, Drive(), 0, streams.spans + warm.spans, len(streams.session_ids))
    try:
        d = drive_streams(transport, grpc_addr if transport == "grpc" else http_addr, streams.bodies, streams.spans,
                          warm.bodies, args.retry_sleep, child,
                          after_warmup=lambda: wait_quiet(metrics_url, warm_traces), on_start=on_start)
        cpu_at_ack = proc_cpu_seconds(pid)   # the last acknowledgement has just arrived (the clients are joined)
        run.drive, run.ack_seconds, run.cpu_ack = d, d.seconds, d.server_cpu
        run.rss_at_ack = proc_status(pid).get("VmHWM", 0)
        run.metrics_ack = get_json(metrics_url)
        t0: float = clock["t0"]
        deadline = time.monotonic() + args.sessions_timeout
        n = 0
        while True:
            if child.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({child.proc.returncode}) while sessions were pending")
            if not _stage_idle(metrics_url) and time.monotonic() <= deadline:
                time.sleep(args.poll_interval)  # the stage is still at work: no SQL poll, which costs the server CPU
                continue
            try:
                n = int(query(db, _count_sql(args.turns)).rows[0][0])
            except QueryError as exc:
                if exc.status != 503:  # busy: try again at the next poll
                    raise
            run.polls += 1
            if n >= run.sessions_expected:
                run.end_seconds = time.perf_counter() - t0
                run.cpu_catchup = proc_cpu_seconds(pid) - cpu_at_ack
                break
            if time.monotonic() > deadline:
                run.timed_out = True
                run.end_seconds = time.perf_counter() - t0
                run.cpu_catchup = proc_cpu_seconds(pid) - cpu_at_ack
                say(f"[red]{transport}: only {n:,} of {run.sessions_expected:,} sessions closed after "
                    f"{args.sessions_timeout:.0f}s[/]")
                break
            time.sleep(args.poll_interval)
        run.sessions_closed = n
        clock["sampler"].stop()
        run.samples = clock["sampler"].samples
        run.rss_peak = proc_status(pid).get("VmHWM", 0)
        run.metrics = get_json(metrics_url)
        like = f"starts_with(session_id, '{SESSION_PREFIX}-')"
        r = query(db, f"select count(*), count(*) filter (where status = 'closed'), "
                      f"count(*) filter (where trace_count <> {args.turns}), sum(version), max(version), "
                      f"sum(span_count), epoch(max(updated_at)) from sessions where {like}")
        row = r.rows[0]
        run.summary = {"rows": row[0], "closed": row[1], "wrong_trace_count": row[2], "scorings": row[3],
                       "max_version": row[4], "span_count": row[5]}
        if row[6] is not None:
            run.last_update_seconds = float(row[6]) - clock["wall0"]
        mix = query(db, f"select outcome, count(*) from sessions where {like} group by 1 order by 2 desc")
        run.summary["outcomes"] = ", ".join(f"{o} {c:,}" for o, c in mix.rows)
        run.stored = stored_spans(db)
    except Exception:
        say(f"[red]agentfunnel ({transport}, sessions) log tail:[/]\n{child.logs()[-3000:]}")
        raise
    finally:
        if "sampler" in clock:
            clock["sampler"].stop()
        rc = child.stop()
    if rc != 0:
        say(f"[yellow]agentfunnel serve ({transport}) exited with {rc}[/]\n{child.logs()[-2000:]}")
    return run


def run_sessions_reference(transport: str, streams: Any, warm: Any, args: argparse.Namespace, workdir: Path,
                           say: Callable[[str], None]) -> SessionRun:
    child = Child(f"reference ({transport})", [sys.executable, str(Path(__file__).resolve()), "--reference-server"],
                  REF_READY, workdir / f"reference-sessions-{transport}.log")
    grpc_addr, http_addr = child.start().groups()
    try:
        d = drive_streams(transport, grpc_addr if transport == "grpc" else http_addr, streams.bodies, streams.spans,
                          warm.bodies, args.retry_sleep, child)
        stored = int(get_json(f"http://{http_addr}/count")["spans"])
    except Exception:
        say(f"[red]reference ({transport}) log tail:[/]\n{child.logs()[-3000:]}")
        raise
    finally:
        child.stop()
    return SessionRun("reference", transport, d, stored, streams.spans + warm.spans, 0,
                      ack_seconds=d.seconds, cpu_ack=d.server_cpu)


def _us(cpu: float, spans: int) -> str:
    return f"{cpu / spans * 1e6:,.1f}" if spans else "-"


def _stage_idle(metrics_url: str) -> bool:
    """No trace open and no job queued or running, as the server's metrics say: only then is the SQL endpoint asked
    whether every session is closed. Each SQL poll streams the sessions' rows to the endpoint's worker, which the
    server's CPU pays for (about 7% of it in a profile when every interval polled)."""
    m = get_json(metrics_url)
    return not m.get("open_traces", 0) and not m.get("jobs_waiting", 0)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f}" if n else "-"


SESSION_METRICS = ("spans_committed", "commits", "traces_assembled", "open_traces", "jobs_waiting",
                   "sessions_finalized_early", "open_refresh_skipped", "assembly_errors", "sessions_failed",
                   "traces_failed", "pushed_back", "sql_queries", "held_traces_evicted", "traces_read_back",
                   "prepare_skipped", "held_bytes", "writer_cpu_microseconds", "writer_runs", "spans_compiled",
                   "spans_handed_back",
                   "compiled_kept_bytes", "gc_passes", "gc_pause_microseconds")
ALWAYS_SHOWN = ("traces_assembled", "open_traces", "jobs_waiting", "sessions_finalized_early", "sessions_failed")


def sessions_report(console: Any, runs: list[SessionRun], args: argparse.Namespace, streams: Any,
                    machine: dict[str, str]) -> None:
    from rich.table import Table

    af = [r for r in runs if r.server == "agentfunnel"]
    ref = {r.transport: r for r in runs if r.server == "reference"}
    t = Table(title=f"Sessions end to end: {len(streams.session_ids):,} sessions × {args.turns} turns × "
                    f"{SPANS_PER_TURN} spans = {streams.spans:,} spans in {streams.requests} requests, "
                    f"{args.concurrency} clients", title_justify="left",
              caption="ack: clock start → last acknowledgement; e2e: → every session closed with all its turns (SQL "
                      "poll); catch-up: between the two; CPU µs/span: the server's CPU in that phase / all spans; "
                      "RSS peak: the server's VmHWM", caption_justify="left")
    for col in ("transport", "ack s", "ack spans/s", "e2e s", "e2e spans/s", "catch-up s", "CPU µs/span ack",
                "CPU µs/span catch-up", "CPU µs/span total", "spans/CPU-s", "RSS peak MiB", "check"):
        t.add_column(col, justify="left" if col in ("transport", "check") else "right")
    for r in af:
        rr = ref.get(r.transport)
        total = r.cpu_ack + r.cpu_catchup
        t.add_row(r.transport, f"{r.ack_seconds:.2f}", f"{r.spans / r.ack_seconds:,.0f}", f"{r.end_seconds:.2f}",
                  f"{r.spans / r.end_seconds:,.0f}", f"{r.end_seconds - r.ack_seconds:.2f}",
                  _us(r.cpu_ack, r.spans), _us(r.cpu_catchup, r.spans), _us(total, r.spans),
                  f"{r.spans / total:,.0f}" if total else "-", _mib(r.rss_peak),
                  "[green]ok[/]" if r.ok and (rr is None or rr.ok) else "[red]MISMATCH[/]")
    console.print(t)

    d = Table(title="Per run", title_justify="left",
              caption="scorings: Σ version of the session rows (a session is re-scored when a later turn is "
                      "assembled); catch-up CPU per trace: catch-up CPU / traces assembled after the last "
                      "acknowledgement (≈ per-turn assembly and scoring cost); newest row: its updated_at (the start "
                      "of its scoring job) after the clock start", caption_justify="left")
    for col in ("transport", "server CPU s ack / catch-up", "server cores ack", "client cores", "p50 / p99 ms",
                "push-backs", "polls", "newest row s", "closed / rows / wrong turns", "scorings",
                "catch-up CPU ms/trace (traces)", "stored spans", "ref ack spans/s"):
        d.add_column(col, justify="left" if col == "transport" else "right")
    for r in af:
        x, s = r.drive, r.summary
        rr = ref.get(r.transport)
        caught = (r.metrics.get("traces_assembled", 0) or 0) - (r.metrics_ack.get("traces_assembled", 0) or 0)
        d.add_row(r.transport, f"{r.cpu_ack:.2f} / {r.cpu_catchup:.2f}", f"{r.cpu_ack / r.ack_seconds:.2f}",
                  f"{x.client_cpu / x.seconds if x.seconds else 0:.2f}",
                  f"{_pct(x.latencies, 0.5) * 1000:.0f} / {_pct(x.latencies, 0.99) * 1000:.0f}",
                  str(x.pushbacks), str(r.polls),
                  f"{r.last_update_seconds:.2f}" if r.last_update_seconds is not None else "-",
                  f"{r.sessions_closed:,} / {s.get('rows', 0):,} / {s.get('wrong_trace_count', 0):,}",
                  f"{s.get('scorings') or 0:,}",
                  f"{r.cpu_catchup / caught * 1000:.2f} ({caught:,})" if caught > 0 else "-",
                  f"{r.stored:,}" if r.stored == r.expected else f"[red]{r.stored:,} ≠ {r.expected:,}[/]",
                  f"{rr.spans / rr.ack_seconds:,.0f}" if rr and rr.ack_seconds else "-")
    console.print(d)
    for r in af:
        console.print(f"{r.transport} outcomes: {r.summary.get('outcomes', '')}")

    lag = Table(title="Session-stage lag (sampled every 0.5 s from the clock start; * = last acknowledgement)",
                title_justify="left")
    for col in ("transport", "t s", "open_traces", "jobs_waiting", "traces_assembled", "RSS MiB"):
        lag.add_column(col, justify="left" if col == "transport" else "right")
    for r in af:
        shown = r.samples if len(r.samples) <= 24 else r.samples[::max(1, len(r.samples) // 20)] + r.samples[-1:]
        marked = False
        for smp in shown:
            mark = ""
            if not marked and smp.t >= r.ack_seconds:
                mark, marked = "*", True
            lag.add_row(r.transport, f"{smp.t:.1f}{mark}", f"{smp.open_traces:,.0f}", f"{smp.jobs_waiting:,.0f}",
                        f"{smp.traces_assembled:,.0f}", _mib(smp.rss))
    console.print(lag)

    mt = Table(title="Machine", title_justify="left", show_header=False)
    mt.add_column("fact")
    mt.add_column("value")
    for k, v in machine.items():
        mt.add_row(k, v)
    console.print(mt)

    m = Table(title="agentfunnel /metrics at the last acknowledgement → at the end", title_justify="left")
    m.add_column("metric")
    for r in af:
        m.add_column(f"{r.transport} server", justify="right")
    flat_ack = [_flatten(r.metrics_ack) for r in af]
    flat_end = [_flatten(r.metrics) for r in af]
    seen = {k for f in flat_end + flat_ack for k in f}
    keys = [k for name in SESSION_METRICS for k in sorted(seen) if k == name or k.startswith(name + "{")]
    keys += [name for name in ALWAYS_SHOWN if name not in seen]   # counters appear once incremented: 0 until then
    for k in keys:
        m.add_row(k, *[f"{a.get(k, 0)} → {e.get(k, 0)}" for a, e in zip(flat_ack, flat_end)])
    console.print(m)


def sessions_main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sessions_payloads import session_streams

    console = Console(width=max(150, Console().width))
    say = console.print
    atexit.register(Child.cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = Path(tempfile.mkdtemp(prefix="agentfunnel-bench-sessions-"))
    transports = ["grpc", "http"] if args.transport == "both" else [args.transport]
    runs: list[SessionRun] = []
    ok = False
    try:
        load_before = loadavg()
        t0 = time.perf_counter()
        streams = session_streams(args.session_count, args.turns, args.concurrency, SPANS_PER_REQUEST,
                                  args.active_sessions, seed=1, prefix=SESSION_PREFIX)
        # Warm-up: about one request per client of one-turn sessions, all closed before the clock starts.
        warm = session_streams(args.concurrency * (SPANS_PER_REQUEST // SPANS_PER_TURN), 1, args.concurrency,
                               SPANS_PER_REQUEST, args.active_sessions, seed=2, prefix="warm")
        size = sum(len(b) for s in streams.bodies for b in s)
        say(f"built {streams.spans:,} spans of {len(streams.session_ids):,} sessions × {args.turns} turns in "
            f"{streams.requests} requests ({streams.spans_per_request:.0f} spans, {streams.traces_per_request:.0f} "
            f"traces, {size / streams.requests / 1024:.0f} KiB each; a turn spans {streams.requests_per_trace:.2f} "
            f"requests) in {time.perf_counter() - t0:.1f}s; load average {load_before}")
        config = sessions_config(args, workdir)
        for tr in transports:
            r = run_sessions_agentfunnel(tr, streams, warm, config, args, workdir, say)
            runs.append(r)
            say(f"{tr:4} agentfunnel: acknowledged {r.spans / r.ack_seconds:9,.0f} spans/s in {r.ack_seconds:.2f}s, "
                f"end to end {r.spans / r.end_seconds:9,.0f} spans/s in {r.end_seconds:.2f}s, "
                f"CPU {r.cpu_ack:.2f}+{r.cpu_catchup:.2f}s, sessions {r.sessions_closed:,}/{r.sessions_expected:,}, "
                f"stored {r.stored:,}/{r.expected:,} " + ("[green]ok[/]" if r.ok else "[red]MISMATCH[/]"))
            if not args.no_reference:
                rr = run_sessions_reference(tr, streams, warm, args, workdir, say)
                runs.append(rr)
                say(f"{tr:4} reference  : acknowledged {rr.spans / rr.ack_seconds:9,.0f} spans/s in "
                    f"{rr.ack_seconds:.2f}s, stored {rr.stored:,}/{rr.expected:,} "
                    + ("[green]ok[/]" if rr.ok else "[red]MISMATCH[/]"))
        machine = machine_facts()
        machine["load average before / after (1 5 15 min)"] = f"{load_before} / {loadavg()}"
        say()
        sessions_report(console, runs, args, streams, machine)
        ok = all(r.ok for r in runs)
        if not ok:
            say("[red]stored spans or closed sessions differ from what was sent[/]")
    finally:
        Child.cleanup()
        if args.keep:
            say(f"kept databases and logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


# ============================================================================ main


def build_bodies(n: int, seed0: int, console: Any, what: str) -> list[bytes]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from payloads import genai_request_bytes

    out = []
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task(f"building {what}", total=n)
        for i in range(n):
            out.append(genai_request_bytes(SPANS_PER_REQUEST, seed=seed0 + i))
            progress.advance(task)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=400,
                   help=f"timed requests per run, {SPANS_PER_REQUEST} spans each (default 400 ≈ 200k spans)")
    p.add_argument("--concurrency", type=int, default=4, help="concurrent clients (default 4)")
    p.add_argument("--transport", choices=["grpc", "http", "both"], default="both")
    p.add_argument("--config", type=Path, help="an agentfunnel config file for the server (e.g. session settings)")
    p.add_argument("--keep", action="store_true", help="keep the databases and server logs, and print where")
    p.add_argument("--no-reference", action="store_true", help="skip the parse-and-count reference server")
    p.add_argument("--retry-sleep", type=float, default=0.05,
                   help="seconds to wait before resending a pushed-back request (default 0.05)")
    p.add_argument("--reference-server", action="store_true", help=argparse.SUPPRESS)
    s = p.add_argument_group("sessions mode (--sessions; --requests is then unused)")
    s.add_argument("--sessions", action="store_true",
                   help="send agent sessions and time them end to end, until every session row is closed")
    s.add_argument("--session-count", type=int, default=3360, help="sessions to send (default 3360)")
    s.add_argument("--turns", type=int, default=2, help="turns per session, one trace each (default 2)")
    s.add_argument("--active-sessions", type=int, default=128,
                   help="sessions each client works at once, their spans interleaved in its requests (default 128)")
    s.add_argument("--poll-interval", type=float, default=0.2,
                   help="seconds between SQL polls for closed sessions after the last acknowledgement (default 0.2)")
    s.add_argument("--stored-traces", type=int, default=0,
                   help="the store starts holding this many older traces' index rows, sessions and tool calls "
                        "(bench/grown_store.py): what a job reads of its sessions on a store that has run a while")
    s.add_argument("--sessions-timeout", type=float, default=600.0,
                   help="give up waiting for the sessions this long after the last acknowledgement (default 600)")
    args = p.parse_args(argv)
    if args.requests < 1 or args.concurrency < 1:
        p.error("--requests and --concurrency must be at least 1")
    if args.sessions and (args.session_count < 1 or args.turns < 1 or args.active_sessions < 1
                          or args.poll_interval <= 0):
        p.error("--session-count, --turns, --active-sessions and --poll-interval must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.reference_server:
        return reference_server()
    if args.sessions:
        return sessions_main(args)

    from rich.console import Console

    console = Console(width=max(150, Console().width))  # wide tables even when piped
    say = console.print
    atexit.register(Child.cleanup)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind through the finally below
    workdir = Path(tempfile.mkdtemp(prefix="agentfunnel-bench-"))
    transports = ["grpc", "http"] if args.transport == "both" else [args.transport]
    runs: list[Run] = []
    ok = False
    try:
        load_before = loadavg()
        t0 = time.perf_counter()
        bodies = build_bodies(args.requests, 0, console, f"{args.requests} requests")
        warmup = build_bodies(args.concurrency * WARMUP_PER_CLIENT, 10_000_000, console, "warm-up requests")
        size = statistics.mean(len(b) for b in bodies)
        say(f"built {len(bodies)} requests × {SPANS_PER_REQUEST} spans ({size / 1024:.0f} KiB each) "
            f"in {time.perf_counter() - t0:.1f}s; load average {load_before}")
        for tr in transports:
            runners = [("agentfunnel", run_agentfunnel)]
            if not args.no_reference:
                runners.append(("reference", run_reference))
            for name, fn in runners:
                r = fn(tr, bodies, warmup, args, workdir, say)
                runs.append(r)
                mark = "[green]ok[/]" if r.stored == r.expected else "[red]MISMATCH[/]"
                say(f"{tr:4} {name:11}: {r.rate:10,.0f} spans/s  {r.drive.seconds:6.2f}s  "
                    f"push-backs {r.drive.pushbacks}  server cores {r.cores:.2f}  "
                    f"stored {r.stored:,}/{r.expected:,} {mark}")
        machine = machine_facts()
        machine["load average before / after (1 5 15 min)"] = f"{load_before} / {loadavg()}"
        say()
        report(console, runs, args, machine)
        ok = all(r.stored == r.expected for r in runs)
        if not ok:
            say("[red]stored span count differs from spans sent[/]")
    finally:
        Child.cleanup()
        if args.keep:
            say(f"kept databases and logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
