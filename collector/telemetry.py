"""Self-metrics: what came in, what was committed, what was refused and why.

Counters are exposed in the Prometheus text format on ``/metrics`` and as JSON for the CLI; every
drop or refusal increments a counter with a reason, so nothing is lost silently.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import defaultdict
from typing import Callable

from ..semconv.dropped import DROPPED

# name -> help; the label, when there is one, is in braces in the key used by ``inc``.
DESCRIPTIONS = {
    "spans_received": "Spans decoded from export requests (before deduplication).",
    "spans_committed": "Spans committed to the store (new rows).",
    "spans_future_dated": "Spans committed whose start is more than retention.max_future_seconds after they arrived "
                          "(a clock ahead); retention ages them by their arrival.",
    "spans_duplicate": "Spans recognised as already stored (retries) and not written again.",
    "spans_rejected": "Spans refused, by reason (partial success or whole request).",
    "logs_received": "Log records decoded from export requests.",
    "logs_committed": "Log records committed to the store.",
    "logs_duplicate": "Log records recognised as already stored.",
    "logs_rejected": "Log records refused, by reason.",
    "metric_points_received": "Metric data points decoded from export requests (before deduplication).",
    "metric_points_committed": "Metric data points committed to the store (new rows in metrics).",
    "metric_points_duplicate": "Metric data points recognised as already stored (retries) and not written again.",
    "metric_points_rejected": "Metric data points refused, by reason (partial success): invalid, too_many_buckets "
                              "(receivers.max_metric_buckets), too_many_points (receivers.max_metric_points), "
                              "decoded_bytes (receivers.max_bytes_in_flight).",
    "requests": "Export requests handled, by receiver and result.",
    "http_unknown_path": "OTLP/HTTP POSTs to a path no route has, answered 404, by class (doubled_signal_path: "
                         "an endpoint that already ended in /v1/traces given as the base URL; prefixed_signal_path; "
                         "other); a warning naming the path is logged at most once a minute.",
    "pushed_back": "Requests answered with a retryable refusal (429/503/UNAVAILABLE), by reason.",
    "commits": "Store transactions committed (each holds one or more requests).",
    "commit_errors": "Store transactions that failed.",
    "dedupe_evictions": "Keys dropped from the duplicate window because it reached its size bound.",
    "traces_assembled": "Traces assembled into sessions (idle timeout, flush, shutdown or early close).",
    "sessions_finalized_early": "Open traces closed before their idle timeout because max_open_traces was reached.",
    "assembly_errors": "Assembly jobs that failed (their traces are retried once, each in a job of its own).",
    "open_refresh_skipped": "Refreshes of open sessions skipped because session work was behind.",
    "jobs_dropped_at_stop": "Store jobs (session work) not begun within receivers.stop_timeout_seconds; redone on the next start.",
    "traces_left_for_restart": "Traces not assembled within shutdown_assembly_seconds; reopened on the next start.",
    "forward_sent_spans": "Spans the downstream accepted (forwarding).",
    "forward_sent_logs": "Evaluation log records the downstream accepted (forwarding, also_logs).",
    "forward_dropped": "Spans not forwarded, by reason (queue_full, intake_full, retry_expired, downstream:<answer>, "
                       "rejected_downstream, encode_error, shutdown).",
    "forward_logs_dropped": "Evaluation log records not forwarded, by reason (as forward_dropped).",
    "forward_retries": "Export attempts retried, by the downstream's answer.",
    "forward_unlabeled_spans": "Hold mode: spans forwarded without session labels, by reason (hold_bytes, no_session, shutdown).",
    "forward_judge_calls": "Judge calls forwarded as spans of agentfunnel's own (a GenAI chat span in the trace of "
                           "the session summary it judged, linked to it).",
    "forward_summaries": "Session summary spans emitted (one per closed session version).",
    "traces_read_back": "Traces assembled from the store rather than from memory (reopened, evicted or recovered).",
    "spans_compiled": "Committed spans the compiled path read and kept from their request (GenAI-semconv traces).",
    "spans_handed_back": "Committed spans the compiled path left to the records path: label trace (their trace has a "
    "span it cannot read exactly) or body (it could not read the request).",
    "prepare_skipped": "Committed spans not normalized ahead because the prepare queue was full (read back at assembly).",
    "assembled_cache_evicted": "Assembled traces dropped from memory (sessions.max_assembled_cache_bytes); read back when needed.",
    "held_traces_evicted": "Open traces dropped from memory to stay within sessions.max_held_bytes (read back at assembly).",
    "values_truncated": "String values (attributes, events, log bodies) cut to receivers.max_attribute_value_bytes.",
    "admin_refused": "Admin endpoint requests refused, by reason (host, origin, content_type, ingest_token, "
                     "bad_token, missing, outside_data_dir).",
    "ui_sign_in": "UI sign-in attempts, by result (ok, wrong, limited: over admin.sign_in_per_minute, answered 429).",
    "ui_writes": "Writes made from the UI, by kind (label: a review label stored; case: a case drafted into the suite).",
    "ui_writes_refused": "UI writes refused, by reason (no_admin_token, origin, csrf, too_large, bad_form, no_writer, "
                         "draft: the suite cannot take the case).",
    "ui_payloads_paged": "UI session pages whose payloads were shown in parts (over sql.page_payload_bytes).",
    "sql_queries": "Read-only SQL queries, by result (ok, refused, timeout, max_rows, max_result_bytes, busy, error).",
    "connections_refused": "HTTP connections answered 503 and closed on arrival, by port and reason (max_connections).",
    "connections_closed": "HTTP connections closed by a limit, by port and reason (header_timeout, malformed_request).",
    "admission_overreleased": "Releases of more in-flight bytes than were held (a bug if ever non-zero; the gauge stays >= 0).",
    "judgments_requeued": "Case runs and sampled sessions queued for the judge again at start: their judgment "
                          "was pending when the process stopped, or never asked (judge.requeue_at_start).",
    "judgments_not_requeued": "Runs waiting for a judgment at start beyond judge.requeue_at_start, left as they are "
                              "(agentfunnel judge asks for them).",
    "archive_errors": "Case-run archive files that could not be written (the case run itself is stored).",
    "sessions_failed": "Sessions whose scoring raised; the other sessions of the same job are stored.",
    "schema_validations_refused": "Checks of a value (a tool call's arguments, a case artifact) against a JSON Schema "
                                  "from telemetry or a suite that gave no verdict, by reason (invalid_schema, "
                                  "schema_too_large, schema_too_deep, unresolvable_ref: a $ref that is not local, "
                                  "never fetched; pattern_unsupported: not matchable in linear time; "
                                  "instance_too_large, too_deep, deadline: scoring.schema_limits). The call's "
                                  "args_valid is NULL; a line is logged at most once a minute per reason.",
    "session_inputs_truncated": "Session rows whose input (the user's first message) was cut to sessions.max_input_bytes.",
    "traces_failed": "Traces whose assembly failed even on their own on a data error; their spans stay stored, "
                     "unassembled, until a later span of theirs or a restart.",
    "traces_assembly_deferred": "Traces whose assembly failed on an I/O error (a full disk, a store that cannot "
                                "commit): kept, and assembled again once writes succeed (sessions.assembly_retry_seconds).",
    "traces_reopened_before_assembly": "Traces that received spans after their assembly was picked and before it "
                                       "ran: assembled with them, their sessions left open, closed when they go idle again.",
    "session_rows_compacted": "Appended session, case-run and stage rows folded into one row per session (stage) "
                              "(sessions.compact_every_seconds); the views read the same.",
    "session_versions_forgotten": "Sessions whose stored version was dropped from memory "
                                  "(sessions.max_versions_remembered); looked up in the store when scored again.",
    "index_filters_built": "Times the filters of the trace and session ids stored were made from the store (on the "
                           "first session job, and each time they fill up; sessions.max_indexed_sessions_remembered).",
    "sessions_revisited_on_start": "Sessions stored open, with every trace assembled, that a start re-scored (left "
                                   "open by a stop before their closing assembly).",
    "redactions": "Values redacted before storage, by detector or rule (email, payment_card, ..., pattern:<name>, "
                  "drop_key, hash_key, content).",
    "rows_pruned": "Rows removed by retention (time-to-live or prune --before), by table.",
    "prune_jobs": "Store jobs that pruned rows (each removes at most retention.max_rows_per_job).",
    "prune_errors": "Pruning passes that failed (logged; the next pass tries again).",
    "snapshots_written": "Periodic snapshots written (store.snapshot_path).",
    "snapshot_errors": "Periodic snapshots that failed (logged; the next one tries again).",
    "file_rewrites": "Rewrites of the database file from its live rows (after a deletion: freed bytes gone).",
    "file_rewrite_milliseconds": "Time spent rewriting the database file (the writer waits meanwhile).",
    "rewrite_readers_interrupted": "Reads interrupted because they were still open store.rewrite_reader_wait_seconds "
                                   "after a rewrite of the file began.",
    "case_run_archives_deleted": "Case-run archive files removed by agentfunnel delete.",
    "rows_deleted": "Rows removed on request (agentfunnel delete --user/--session), by table.",
    "lake_shipments": "Lake: batches shipped from the replica's own file to its schema of the lake (one lake "
                      "transaction each).",
    "lake_rows_shipped": "Lake: rows shipped, by table (a trace assembled again ships its rows again, replacing them).",
    "lake_ship_errors": "Lake: shipments that failed (the batch stays claimed and is shipped again).",
    "lake_maintenance": "Lake: maintenance rounds done (small files merged; on replica 0 snapshots expired too).",
    "lake_maintenance_errors": "Lake: maintenance rounds that failed (the next round tries again).",
    "writer_cpu_microseconds": "CPU time of the store's writer thread, by work: commit (ingest), sessions (assembly and "
                               "scoring), follow (a lake replica's polls for sessions others assembled that ran as jobs of "
                               "their own; one that ran with an assembly is in sessions), ship, judgments, "
                               "retention, other. Beside jobs_waiting it says what a busy writer is busy with.",
    "monitor_evaluations": "Evaluations of monitor rules, by result: fired, quiet (no significant change), too_few "
                           "(a side below monitors.min_sample), too_small (below the rule's min_change), "
                           "no_baseline (no previous version), repeat (already reported for this window), error.",
    "monitor_webhook_sends": "Firings posted to monitors.webhook, by result: delivered, refused (a 4xx other than "
                             "429), failed (no success within monitors.webhook.retries).",
    "monitor_webhook_retries": "Webhook attempts retried after a timeout, a connection error, 429 or 5xx "
                               "(at most monitors.webhook.retries per firing).",
    "feedback_received": "User feedback items received, by source (otlp_log, otlp_span_event, http).",
    "feedback_committed": "User feedback items committed to the feedback table (new rows).",
    "feedback_duplicate": "User feedback items recognised as already stored (a retried export or request).",
    "feedback_rejected": "User feedback items refused, by reason (invalid: a field named in the answer; too_many: "
                         "over feedback.max_items_per_request; write_error: the store could not commit them).",
    "feedback_truncated": "User feedback values cut to their bound, by field (comment: feedback.max_comment_chars; "
                          "other fields: feedback.max_field_chars).",
    "dialect_reads_dropped": "What lenient normalization passed over, by <dialect>:<reason>: extract_error (the "
                             "dialect's extract raised on a span; its fields for the span are lost), unknown_field (it "
                             "returned a field a record does not take, e.g. misspelled; dropped), messages_error (its "
                             "messages reader raised; the next dialect's is used). Each is logged once per dialect and "
                             "field (or exception type). Counted for the whole process.",
    "gc_passes": "Passes of Python's cyclic garbage collector, by generation (0 young, 2 full). Counted for the whole "
                 "process, from its start.",
    "gc_pause_microseconds": "Wall time those passes took, by generation, the finalizers they ran included: the "
                             "other threads wait while one runs (unless a finalizer lets them go), so it is time "
                             "taken from ingest and session work alike.",
    "writer_runs": "Group commits and jobs the store's writer ran, by the same work as writer_cpu_microseconds: with it, "
                   "what one costs on average (a job pays for its statements however little it holds).",
}


class CollectorPauses:
    """The cyclic collector's passes and their wall time, by generation, told by its own callbacks. Kept without a
    lock: passes never overlap (one holds the interpreter while it runs), and the callback must not take a lock a
    thread may hold when its allocation starts a pass."""

    def __init__(self) -> None:
        self._passes = [0, 0, 0]
        self._micros = [0, 0, 0]
        self._began: float | None = None
        self._installed = False

    def install(self) -> None:
        """Start counting (once per process; again is a no-op)."""
        if not self._installed:
            self._installed = True
            gc.callbacks.append(self._on_pass)

    def _on_pass(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        if self._began is None:  # installed while a pass ran: its start was not seen
            return
        generation = info["generation"]
        self._passes[generation] += 1
        self._micros[generation] += round((time.perf_counter() - self._began) * 1e6)
        self._began = None

    def passes(self) -> dict[str, int]:
        return {str(g): n for g, n in enumerate(self._passes) if n}

    def pause_microseconds(self) -> dict[str, int]:
        return {str(g): n for g, n in enumerate(self._micros) if n}


COLLECTOR_PAUSES = CollectorPauses()
# Counters kept elsewhere (semconv reports to nothing above it; the collector's passes are counted by its own
# callbacks): name -> its counts by label, read when shown.
HELD_ELSEWHERE: dict[str, Callable[[], dict[str, int]]] = {"dialect_reads_dropped": DROPPED.counts,
                                                           "gc_passes": COLLECTOR_PAUSES.passes,
                                                           "gc_pause_microseconds": COLLECTOR_PAUSES.pause_microseconds}
GAUGES = {
    "queue_bytes": "Payload bytes admitted and not yet committed (in flight).",
    "store_failing": "1 while the store's commits fail (e.g. a full disk; /readyz answers 503, as do exports, "
                     "retryable), 0 once one succeeds.",
    "queue_requests": "Requests waiting for the store.",
    "dedupe_keys": "Span, log record and metric data point keys held in the duplicate window.",
    "open_traces": "Traces received and not yet assembled into sessions.",
    "traces_awaiting_retry": "Traces whose assembly failed on an I/O error, waiting for the store to write again.",
    "jobs_waiting": "Store jobs (session assembly, rescoring, judgments) submitted and not finished.",
    "forward_queue_bytes": "Forwarding: encoded request bytes waiting to be sent downstream.",
    "forward_queue_requests": "Forwarding: requests waiting to be sent downstream.",
    "forward_held_bytes": "Forwarding, hold mode: bytes of spans held until their session closes.",
    "forward_intake_bytes": "Forwarding: committed span batches waiting to be labelled and encoded, at what they hold "
                            "(forward.queue_max_bytes).",
    "uptime_seconds": "Seconds since the process started.",
    "prepare_queue_bytes": "Committed batches waiting to be normalized and held, at what they hold decoded (sessions.max_prepare_queue_bytes).",
    "assembled_cache_bytes": "Estimated bytes of recently assembled traces kept for scoring later turns.",
    "compiled_kept_bytes": "Bytes the compiled path keeps of open traces' spans (counted in held_bytes too).",
    "held_bytes": "Estimated bytes of open traces' spans held in memory (bounded by sessions.max_held_bytes).",
    "held_traces": "Open traces whose spans are held in memory.",
    "bytes_in_flight": "Admission control: request bytes read or being read and not yet committed.",
    "predicted_wait_ms": "Admission control: how long the bytes in flight would take to be answered at the recent rate; "
                         "past receivers.max_commit_wait_seconds new requests are pushed back (commit_wait).",
    "sql_queries_running": "Read-only SQL queries running now.",
    "http_connections": "Open connections on the OTLP/HTTP port.",
    "admin_connections": "Open connections on the loopback SQL/admin port.",
    "lake_ship_lag_seconds": "Lake: how long the oldest commit not yet shipped to the lake has waited (0: all "
                             "shipped). Spans also wait for their trace to be assembled.",
    "lake_unshipped_rows": "Lake: rows ingested since the last shipment started.",
    "grpc_calls_in_progress": "OTLP/gRPC export calls in progress (reading, decoding or waiting for their commit).",
}


class Metrics:
    """Thread-safe counters with an optional label, and gauges read from callbacks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, str], int] = defaultdict(int)
        self._gauges: dict[str, Callable[[], float]] = {}
        self._expositions: list[Callable[[], list[str]]] = []
        self._started = time.monotonic()
        self.gauge("uptime_seconds", lambda: time.monotonic() - self._started)

    def inc(self, name: str, value: int = 1, label: str = "") -> None:
        if name not in DESCRIPTIONS:
            raise KeyError(f"unknown counter {name}")
        with self._lock:
            self._counters[(name, label)] += value

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        if name not in GAUGES:
            raise KeyError(f"unknown gauge {name}")
        self._gauges[name] = read

    def exposition(self, lines: Callable[[], list[str]]) -> None:
        """Series with labels of their own (per monitor), appended to the Prometheus text as ``lines`` gives them."""
        self._expositions.append(lines)

    def _items(self) -> list[tuple[tuple[str, str], int]]:
        """Every counter by (name, label), the ones held elsewhere included, sorted."""
        with self._lock:
            items = list(self._counters.items())
        for name, read in HELD_ELSEWHERE.items():
            items += [((name, label), n) for label, n in read().items()]
        return sorted(items)

    def get(self, name: str, label: str | None = None) -> int:
        if name in HELD_ELSEWHERE:
            counts = HELD_ELSEWHERE[name]()
            return counts.get(label, 0) if label is not None else sum(counts.values())
        with self._lock:
            if label is not None:
                return self._counters.get((name, label), 0)
            return sum(v for (n, _), v in self._counters.items() if n == name)

    def snapshot(self) -> dict[str, object]:
        """Counters (a number, or a dict by label) and gauges, for JSON."""
        out: dict[str, object] = {}
        for (name, label), value in self._items():
            if label:
                out.setdefault(name, {})[label] = value  # type: ignore[index]
            else:
                out[name] = value
        for name, read in self._gauges.items():
            out[name] = round(read(), 3)
        return out

    def prometheus(self) -> str:
        """The Prometheus text exposition format."""
        lines = []
        items = self._items()
        for name, help_text in DESCRIPTIONS.items():
            metric = f"agentfunnel_{name}_total"
            lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} counter"]
            rows = [(label, v) for (n, label), v in items if n == name]
            if not rows:
                lines.append(f"{metric} 0")
            for label, value in rows:
                lines.append(f'{metric}{{reason="{label}"}} {value}' if label else f"{metric} {value}")
        for name, read in self._gauges.items():
            metric = f"agentfunnel_{name}"
            lines += [f"# HELP {metric} {GAUGES[name]}", f"# TYPE {metric} gauge", f"{metric} {read():g}"]
        for more in self._expositions:
            lines += more()
        return "\n".join(lines) + "\n"
