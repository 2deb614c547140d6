"""``agentfunnel eval run``: start the user's agent once per case and run, and score what it exported.

For every case of the suite and each of the k runs, the command after ``--`` is started as it was
given (never through a shell) with the standard OpenTelemetry variables pointing at agentfunnel
and the run's identity in ``OTEL_RESOURCE_ATTRIBUTES``, plus the case in ``AGENTFUNNEL_*``
variables (``ENV_VARS``): an agent that sets up OTLP export from the environment, as the SDKs do,
needs no change to be evaluated.

When a run's process has ended, the harness writes one span of its own (``agentfunnel.harness.run``:
how the process ended, its exit code and the tail of its stderr) into the run's first trace, or
into a trace of its own when the agent exported nothing, and has the run's traces assembled at
once. So a run that exits non-zero, hangs past ``--timeout`` or exports nothing is still a case
run, scored ``crash`` (or ``timeout``) through the same pipeline, and counted in every pass rate;
``harness_runs`` shows each run's process outcome. Ctrl-C stops the runs in progress (stored as
``interrupted``: kept, but in no pass rate) and keeps what finished.

The pure middle (planning, the child's environment, the outcome of a process, the harness span) is
tested without processes; ``Runner`` is the process edge and ``Target`` the server edge.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from ..scoring.case_models import Case
from ..semconv.attributes import (AGENTFUNNEL_CASE_ID, AGENTFUNNEL_EXPERIMENT, AGENTFUNNEL_HARNESS_EXIT_CODE,
                                  AGENTFUNNEL_HARNESS_MESSAGE, AGENTFUNNEL_HARNESS_OUTCOME, AGENTFUNNEL_HARNESS_SPAN,
                                  AGENTFUNNEL_HARNESS_STDERR_TAIL, AGENTFUNNEL_HARNESS_TIMEOUT, AGENTFUNNEL_RUN_ID)
from .config import StoreSettings
from .query import query

# What the agent's process gets besides the OTEL_* variables (documented in the README).
ENV_CASE_ID = "AGENTFUNNEL_CASE_ID"
ENV_CASE_TASK = "AGENTFUNNEL_CASE_TASK"
ENV_EXPERIMENT = "AGENTFUNNEL_EXPERIMENT"
ENV_RUN_ID = "AGENTFUNNEL_RUN_ID"
ENV_RUN_INDEX = "AGENTFUNNEL_RUN_INDEX"  # 1..k
ENV_OTLP_HTTP = "AGENTFUNNEL_OTLP_HTTP_ENDPOINT"  # also in OTEL_EXPORTER_OTLP_ENDPOINT
ENV_OTLP_GRPC = "AGENTFUNNEL_OTLP_GRPC_ENDPOINT"  # host:port, for an exporter that speaks only gRPC
ENV_VARS = (ENV_CASE_ID, ENV_CASE_TASK, ENV_EXPERIMENT, ENV_RUN_ID, ENV_RUN_INDEX, ENV_OTLP_HTTP, ENV_OTLP_GRPC)
# Per-signal overrides the user's shell may hold (a production collector): removed, so the runs reach us.
_TRACE_OVERRIDES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                    "OTEL_EXPORTER_OTLP_TRACES_HEADERS")

STDERR_TAIL_BYTES = 4096  # of each run's stderr, kept in its harness span
KILL_GRACE_SECONDS = 2.0  # between SIGTERM to the run's process group and SIGKILL
SEND_ATTEMPTS = 5
SETTLE_SECONDS = 10.0  # past receivers.max_commit_wait_seconds (5): a request in flight is committed or refused by then
SINCE_SLACK = dt.timedelta(minutes=5)  # clocks of one machine, but spans may be stamped by the agent


@dataclass(frozen=True)
class RunSpec:
    """One run of one case: what its process is told."""

    case_id: str
    task: str
    experiment: str
    run_id: str
    index: int  # 1..k


def select_cases(cases: Sequence[Case], wanted: Sequence[str] | None) -> list[Case]:
    """The cases to run, in the suite's order; ``wanted`` ids that the suite lacks are an error naming them."""
    if not wanted:
        return list(cases)
    known = {c.id for c in cases}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise ValueError(f"--case {', '.join(unknown)}: not in the suite (it has {', '.join(sorted(known))})")
    return [c for c in cases if c.id in set(wanted)]


def plan_runs(cases: Sequence[Case], k: int, experiment: str, batch: str) -> list[RunSpec]:
    """Every case ``k`` times, run 1 of every case first, so a suite stopped early has covered every case evenly.
    Run ids are unique per invocation (``batch``): a rerun under the same experiment name adds runs."""
    if k < 1:
        raise ValueError("--k must be at least 1")
    return [RunSpec(c.id, c.task, experiment, f"{c.id}-{i}-{batch}", i) for i in range(1, k + 1) for c in cases]


def new_batch() -> str:
    return secrets.token_hex(3)


def resource_attributes(existing: str | None, spec: RunSpec) -> str:
    """``OTEL_RESOURCE_ATTRIBUTES`` with the run's identity (percent-encoded, as the variable's format says);
    the user's own entries stay, except ours, which the run's values replace."""
    ours = {AGENTFUNNEL_CASE_ID: spec.case_id, AGENTFUNNEL_EXPERIMENT: spec.experiment, AGENTFUNNEL_RUN_ID: spec.run_id}
    kept = [item.strip() for item in (existing or "").split(",")
            if item.strip() and item.split("=", 1)[0].strip() not in ours]
    return ",".join([*kept, *(f"{k}={quote(v, safe='')}" for k, v in ours.items())])


@dataclass(frozen=True)
class Endpoint:
    """Where runs export: the OTLP/HTTP base URL (``http://host:port``), the gRPC ``host:port``, the bearer token."""

    http: str
    grpc: str | None = None
    token: str | None = None


def run_environment(base: Mapping[str, str], spec: RunSpec, endpoint: Endpoint) -> dict[str, str]:
    """The environment of one run's process: the caller's, pointed at agentfunnel, with the case and run."""
    env = {k: v for k, v in base.items() if k not in _TRACE_OVERRIDES}
    env.update({
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint.http,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_RESOURCE_ATTRIBUTES": resource_attributes(base.get("OTEL_RESOURCE_ATTRIBUTES"), spec),
        ENV_CASE_ID: spec.case_id, ENV_CASE_TASK: spec.task, ENV_EXPERIMENT: spec.experiment,
        ENV_RUN_ID: spec.run_id, ENV_RUN_INDEX: str(spec.index), ENV_OTLP_HTTP: endpoint.http,
    })
    env.setdefault("OTEL_BSP_SCHEDULE_DELAY", "500")  # spans reach us during the run, so a hung run shows how far it got
    if endpoint.grpc:
        env[ENV_OTLP_GRPC] = endpoint.grpc
    else:
        env.pop(ENV_OTLP_GRPC, None)
    if endpoint.token:
        auth = "authorization=" + quote(f"Bearer {endpoint.token}", safe="")
        others = [h for h in base.get("OTEL_EXPORTER_OTLP_HEADERS", "").split(",")
                  if h.strip() and h.split("=", 1)[0].strip().lower() != "authorization"]
        env["OTEL_EXPORTER_OTLP_HEADERS"] = ",".join([*others, auth])
    return env


# ---------------------------------------------------------------------------- how a process ended


@dataclass(frozen=True)
class ProcessResult:
    outcome: str  # ok | crash | timeout | interrupted (semconv.attributes.HARNESS_OUTCOMES)
    message: str  # why, in one line ("" when ok)
    exit_code: int | None
    stderr_tail: str
    started_ns: int
    ended_ns: int

    @property
    def seconds(self) -> float:
        return (self.ended_ns - self.started_ns) / 1e9


def last_line(text: str, limit: int = 200) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""


def classify(exit_code: int | None, timed_out: bool, interrupted: bool, timeout_s: float,
             stderr_tail: str) -> tuple[str, str]:
    """(outcome, message) of a finished process: interrupted, timed out, exited 0, or crashed (with its reason)."""
    if interrupted:
        return "interrupted", "interrupted (Ctrl-C): the run was stopped before it finished"
    if timed_out:
        return "timeout", f"killed after the {timeout_s:g} s timeout"
    if exit_code == 0:
        return "ok", ""
    if exit_code is not None and exit_code < 0:
        try:
            how = f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            how = f"killed by signal {-exit_code}"
    else:
        how = f"exit code {exit_code}"
    line = last_line(stderr_tail)
    return "crash", f"{how}: {line}" if line else how


def harness_request(spec: RunSpec, result: ProcessResult, trace_id: str | None, timeout_s: float,
                    span_id: str | None = None) -> Any:
    """The OTLP request holding the run's harness span, in ``trace_id`` (the run's first trace) or a new trace."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    def kv(key: str, value: Any) -> KeyValue:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return KeyValue(key=key, value=AnyValue(string_value=str(value)))
        if isinstance(value, int):
            return KeyValue(key=key, value=AnyValue(int_value=value))
        return KeyValue(key=key, value=AnyValue(double_value=value))

    attrs = {AGENTFUNNEL_HARNESS_OUTCOME: result.outcome, AGENTFUNNEL_HARNESS_MESSAGE: result.message,
             AGENTFUNNEL_HARNESS_TIMEOUT: float(timeout_s), AGENTFUNNEL_HARNESS_STDERR_TAIL: result.stderr_tail}
    if result.exit_code is not None:
        attrs[AGENTFUNNEL_HARNESS_EXIT_CODE] = result.exit_code
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend([kv(AGENTFUNNEL_CASE_ID, spec.case_id), kv(AGENTFUNNEL_EXPERIMENT, spec.experiment),
                                   kv(AGENTFUNNEL_RUN_ID, spec.run_id)])
    ss = rs.scope_spans.add()
    ss.scope.name = "agentfunnel.eval"
    span = ss.spans.add()
    span.trace_id = bytes.fromhex(trace_id) if trace_id else secrets.token_bytes(16)
    span.span_id = bytes.fromhex(span_id) if span_id else secrets.token_bytes(8)
    span.name = AGENTFUNNEL_HARNESS_SPAN
    span.kind = Span.SPAN_KIND_INTERNAL
    span.start_time_unix_nano, span.end_time_unix_nano = result.started_ns, max(result.ended_ns, result.started_ns)
    span.attributes.extend(kv(k, v) for k, v in attrs.items())
    return req


class _Tail(threading.Thread):
    """Reads a pipe to its end, keeping only the last ``limit`` bytes (a chatty process cannot fill memory)."""

    def __init__(self, pipe: Any, limit: int = STDERR_TAIL_BYTES) -> None:
        super().__init__(daemon=True, name="agentfunnel-eval-stderr")
        self.pipe, self.limit = pipe, limit
        self.chunks: deque[bytes] = deque()
        self.size = 0

    def run(self) -> None:
        try:
            for chunk in iter(lambda: self.pipe.read1(8192), b""):
                self.chunks.append(chunk)
                self.size += len(chunk)
                while self.size - len(self.chunks[0]) >= self.limit:
                    self.size -= len(self.chunks.popleft())
        except (OSError, ValueError):
            pass

    def text(self) -> str:
        data = b"".join(self.chunks)[-self.limit:]
        return data.decode("utf-8", errors="replace")


def _stop(proc: subprocess.Popen, grace: float = KILL_GRACE_SECONDS) -> None:
    """SIGTERM to the run's whole process group, then SIGKILL: an agent's own children go too."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_process(command: Sequence[str], env: Mapping[str, str], timeout_s: float, stop: threading.Event,
                cwd: Path | None = None) -> ProcessResult:
    """Run one process to its end, its timeout or ``stop``; never through a shell."""
    started = time.time_ns()
    try:
        proc = subprocess.Popen(list(command), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:  # not found, not executable: a run that crashed before it began
        ended = time.time_ns()
        return ProcessResult("crash", f"cannot start {command[0]!r}: {exc.strerror or exc}", None, "", started, ended)
    tail = _Tail(proc.stderr)
    tail.start()
    deadline = time.monotonic() + timeout_s
    timed_out = interrupted = False
    while True:
        try:
            proc.wait(timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            if stop.is_set():
                interrupted = True
            elif time.monotonic() >= deadline:
                timed_out = True
            else:
                continue
            _stop(proc)
            break
    ended = time.time_ns()
    tail.join(2.0)
    stderr = tail.text()
    outcome, message = classify(proc.returncode, timed_out, interrupted, timeout_s, stderr)
    return ProcessResult(outcome, message, None if timed_out or interrupted else proc.returncode, stderr,
                         started, ended)


# ---------------------------------------------------------------------------- the server side


class Target(Protocol):
    """A running agentfunnel the runs export to: embedded in this process, or one already serving."""

    endpoint: Endpoint
    db: Path | StoreSettings

    def assemble(self, trace_ids: list[str]) -> None: ...

    def settle(self, timeout: float) -> None:
        """Wait (up to ``timeout``) for requests received but not yet committed: a killed run's last export."""


def _literal(value: str) -> str:
    if "\x00" in value:
        raise ValueError("values cannot contain NUL")
    return "'" + value.replace("'", "''") + "'"


def run_traces(db: Path | StoreSettings, run_ids: Sequence[str], since_ns: int) -> dict[str, list[str]]:
    """run id -> its traces, the earliest first (spans carry the run id in their resource, or set it themselves)."""
    if not run_ids:
        return {}
    since = (dt.datetime.fromtimestamp(since_ns / 1e9, dt.timezone.utc).replace(tzinfo=None) - SINCE_SLACK)
    ids = ", ".join(_literal(r) for r in run_ids)
    res = query(db, "WITH s AS (SELECT trace_id, start_time, coalesce("
                    "json_extract_string(resource_attributes, '$.\"agentfunnel.run.id\"'), "
                    "json_extract_string(attributes, '$.\"agentfunnel.run.id\"')) AS run_id FROM spans "
                    f"WHERE start_time >= TIMESTAMP {_literal(since.isoformat(sep=' '))}) "
                    f"SELECT run_id, trace_id, min(start_time) AS first FROM s WHERE run_id IN ({ids}) "
                    "GROUP BY run_id, trace_id ORDER BY run_id, first, trace_id")
    out: dict[str, list[str]] = {}
    for run_id, trace_id, _ in res.rows:
        out.setdefault(run_id, []).append(trace_id)
    return out


def send_spans(endpoint: Endpoint, request: Any, sleep: Callable[[float], None] = time.sleep) -> None:
    """POST one OTLP/HTTP protobuf request; retried while the server pushes back (429/503) or is unreachable."""
    body = request.SerializeToString()
    headers = {"Content-Type": "application/x-protobuf"}
    if endpoint.token:
        headers["Authorization"] = f"Bearer {endpoint.token}"
    for attempt in range(1, SEND_ATTEMPTS + 1):
        req = urllib.request.Request(endpoint.http.rstrip("/") + "/v1/traces", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                resp.read()
                return
        except urllib.error.HTTPError as exc:
            if exc.code not in (429, 503) or attempt == SEND_ATTEMPTS:
                raise OSError(f"the server refused the harness span: HTTP {exc.code}") from None
        except urllib.error.URLError as exc:
            if attempt == SEND_ATTEMPTS:
                raise OSError(f"cannot reach {endpoint.http}: {exc.reason}") from None
        sleep(0.2 * 2 ** attempt)


@dataclass(frozen=True)
class RunRecord:
    spec: RunSpec
    result: ProcessResult
    traces: tuple[str, ...]  # the agent's traces, the harness span's first


class Runner:
    """Runs the planned runs ``concurrency`` at a time against ``target``; ``stop()`` ends them early."""

    def __init__(self, target: Target, command: Sequence[str], timeout_s: float, concurrency: int,
                 environ: Mapping[str, str] | None = None, on_done: Callable[[RunRecord], None] | None = None) -> None:
        self.target, self.command, self.timeout_s = target, list(command), timeout_s
        self.concurrency = max(1, concurrency)
        self.environ = dict(os.environ if environ is None else environ)
        self.on_done = on_done
        self.stopping = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def run_one(self, spec: RunSpec) -> RunRecord | None:
        if self.stopping.is_set():
            return None  # not started: Ctrl-C came first
        env = run_environment(self.environ, spec, self.target.endpoint)
        result = run_process(self.command, env, self.timeout_s, self.stopping)
        if result.outcome in ("timeout", "interrupted"):  # killed, perhaps with an export received but uncommitted
            self.target.settle(SETTLE_SECONDS)
        traces = run_traces(self.target.db, [spec.run_id], result.started_ns).get(spec.run_id, [])
        request = harness_request(spec, result, traces[0] if traces else None, self.timeout_s)
        harness_trace = request.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()
        send_spans(self.target.endpoint, request)
        all_traces = list(dict.fromkeys([*traces, harness_trace]))
        self.target.assemble(all_traces)
        record = RunRecord(spec, result, tuple(all_traces))
        if self.on_done is not None:
            self.on_done(record)
        return record

    def run(self, specs: Sequence[RunSpec]) -> list[RunRecord]:
        """Every run; on KeyboardInterrupt the runs in progress are stopped (and recorded as interrupted),
        the ones not started are skipped, and KeyboardInterrupt is raised again once they are."""
        from concurrent.futures import ThreadPoolExecutor, wait

        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="agentfunnel-eval")
        futures = [pool.submit(self.run_one, s) for s in specs]
        interrupted = False
        try:
            while True:
                done, waiting = wait(futures, timeout=0.2)
                if not waiting:
                    break
        except KeyboardInterrupt:
            interrupted = True
            self.stop()
            wait(futures)
        finally:
            pool.shutdown(wait=True)
        records = []
        for f in futures:
            exc = f.exception()
            if exc is not None and not interrupted:
                raise exc
            if exc is None and f.result() is not None:
                records.append(f.result())
        if interrupted:
            raise Interrupted(records)  # type: ignore[arg-type]
        return records  # type: ignore[return-value]  # only results that are not None are kept


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a batch: the runs that finished before it (``records``), which ``eval run`` still closes and
    summarizes."""

    def __init__(self, records: list[RunRecord]) -> None:
        super().__init__()
        self.records = records
