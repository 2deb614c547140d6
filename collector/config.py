"""Settings for the processor: one frozen pydantic model per stage, defaults that work.

Resolution order: command-line flag > environment variable (``AGENTFUNNEL_*``, for the few
settings operators set per deployment) > config file (TOML or YAML) > default. Unknown keys are
errors that name the key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from ..scoring import ScoringConfig
from ..scoring.judge import JudgeSettings
from ..scoring.regex import linear
from .monitors.settings import MonitorSettings

MiB = 1024 * 1024


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TLSSettings(_Model):
    """Serve both receivers over TLS with this certificate chain and key (PEM files)."""

    cert_file: Path = Field(description="PEM certificate chain, leaf first.")
    key_file: Path = Field(description="PEM private key of the certificate.")

    @model_validator(mode="after")
    def _files_exist(self) -> "TLSSettings":
        for name in ("cert_file", "key_file"):
            if not getattr(self, name).is_file():
                raise ValueError(f"{name} {getattr(self, name)} does not exist")
        return self


class ReceiverSettings(_Model):
    """OTLP receivers (gRPC and HTTP) and their limits."""

    host: str = Field("127.0.0.1", description="Interface to bind; listening beyond loopback is explicit.")
    grpc_port: int = Field(4317, ge=0, le=65535, description="OTLP/gRPC port; 0 picks a free one.")
    http_port: int = Field(4318, ge=0, le=65535, description="OTLP/HTTP port; 0 picks a free one.")
    grpc_enabled: bool = Field(True, description="Run the OTLP/gRPC receiver.")
    http_enabled: bool = Field(True, description="Run the OTLP/HTTP receiver (and the UI under /ui/).")
    max_request_bytes: int = Field(64 * MiB, gt=0, description="Largest request body, after decompression.")
    max_attribute_value_bytes: int = Field(
        1 * MiB, gt=0, description="Longest string value kept in an attribute, event or log body; longer ones are "
        "cut, marked and counted (values_truncated), like the SDKs' own attribute length limit. It bounds what one "
        "span costs in session assembly, which holds a value several times over.")
    stop_timeout_seconds: float = Field(
        15.0, gt=0, description="On SIGTERM or SIGINT, the most time stopping may take: new requests are refused at "
        "once, queued ones committed or cut off (their clients retry), and traces not yet assembled are finished on "
        "the next start. Past it the process exits anyway; nothing acknowledged is lost.")
    max_commit_wait_seconds: float = Field(
        2.5, ge=0, description="A request whose batch would wait longer than this for its commit (predicted from "
        "what is queued and the recent commit rate) is answered 503 with Retry-After / UNAVAILABLE, so clients back "
        "off instead of timing out; 0 turns it off.")
    max_value_depth: int = Field(
        31, gt=0, le=200, description="How many levels of arrays and kvlists an attribute value or log body may nest "
        "in OTLP/JSON; deeper is refused with 400 (counted in requests as <signal>:too_deep). 31 is the deepest kvlist "
        "OTLP/protobuf can carry (its decoders stop at 100 nested messages), so what is accepted can be forwarded; "
        "at most 200, within what JSON parsing allows.")
    max_bytes_in_flight: int = Field(
        64 * MiB, gt=0, description="Admission control: payload bytes accepted and not yet committed, at what they "
        "decode to once decoded (metrics: counted on the wire before they are; a request's data points past it are "
        "refused, counted in metric_points_rejected as decoded_bytes)."
    )
    max_metric_buckets: int = Field(
        4096, gt=0, description="Values one list of a metric data point may hold (a histogram's bucket counts or "
        "bounds, an exponential histogram's positive or negative bucket counts, a summary's quantiles); a point with "
        "a longer one is refused undecoded (partial success naming it), counted in metric_points_rejected as "
        "too_many_buckets. OTel SDKs send at most 160 per side (exponential histograms' max_size).")
    max_metric_points: int = Field(
        100_000, gt=0, description="Data points one metrics request may carry; the rest are refused (partial "
        "success), counted in metric_points_rejected as too_many_points.")
    retry_after_seconds: float = Field(1.0, ge=0, description="Delay suggested to clients when pushing back.")
    header_timeout_seconds: float = Field(
        10.0, gt=0, description="A new connection must send its first request's headers within this long (HTTP; "
        "gRPC: the connection handshake).")
    body_timeout_seconds: float = Field(
        30.0, gt=0, description="A request body must arrive in full within this long of its headers (HTTP: 408).")
    idle_timeout_seconds: float = Field(
        60.0, gt=0, description="A connection with no request in progress is closed after this long.")
    max_connections: int = Field(
        512, gt=0, description="Open HTTP connections per port; beyond it a new one is answered 503 and closed.")
    max_concurrent_requests: int = Field(
        64, gt=0, description="Export calls in progress per receiver; beyond it a call is refused as saturated "
        "(before its body is read on gRPC).")
    bearer_token: str | None = Field(None, description="Require `Authorization: Bearer <token>` on every request.")
    tls: TLSSettings | None = None


class LakeSettings(_Model):
    """Shared storage for several replicas: a DuckLake (PostgreSQL catalog, Parquet data); needs the ``lake`` extra.

    Every replica commits into its own file (``store.path``) and ships what it committed into its
    own schema of the lake (``r<replica>``), so each table has one writer; each session is scored
    by one replica, chosen by a hash of its id over ``replicas``.
    """

    catalog: str = Field(description="DuckLake catalog: `postgres:<libpq conninfo>`, e.g. "
                                     "`postgres:host=pg dbname=agentfunnel user=agentfunnel` (password: PGPASSWORD).")
    data_path: str = Field(description="Where the Parquet files go: a directory every replica shares, or `s3://bucket/prefix/`.")
    replica: int = Field(ge=0, description="This replica's index, 0..replicas-1; a name ending in -N (a StatefulSet "
                                           "pod's hostname) gives N.")
    replicas: int = Field(ge=1, le=1024, description="How many replicas share the lake (fixes session ownership).")
    poll_interval_seconds: float | None = Field(
        None, gt=0, description="How often a replica looks for traces other replicas assembled for sessions it owns; "
        "unset: every ship_interval_seconds, since what the others assemble reaches the lake only as often as they "
        "ship (a shorter poll mostly finds nothing new, and each one is a catalog read in a store job).")
    ship_interval_seconds: float = Field(
        10.0, gt=0, description="Age threshold: the longest a row committed in the replica's own file (`store.path`) "
        "waits before it is shipped to the lake, in one transaction with everything else pending. Each shipment, "
        "and each poll that follows it, costs tens of milliseconds of CPU however little it carries, so a replica "
        "pays that once per interval; spans reach the lake only after their trace's idle timeout anyway.")
    ship_batch_rows: int = Field(
        200_000, gt=0, description="Size threshold: rows committed locally since the last shipment that make the "
                                   "next one start before ship_interval_seconds; also the most log records and "
                                   "metric points (and traces, and sessions) one shipment takes, so a backlog "
                                   "goes in several.")
    compact_interval_seconds: float = Field(
        300.0, ge=0, description="How often the replica merges the small Parquet files of its own schema "
        "(ducklake_merge_adjacent_files, and rewrites files mostly deleted); replica 0 also expires old snapshots "
        "and deletes the files nothing reads any more. 0 = never (run DuckLake's maintenance yourself).")
    snapshot_retention_seconds: float = Field(
        3600.0, gt=0, description="Snapshots older than this are expired (time travel and the change feed reach "
        "this far back); an owner down for longer re-reads every session it owns when it restarts. The assembled "
        "traces a replica keeps in the lake for other replicas' sessions are deleted after this long too (every "
        "compact_interval_seconds, or this long when 0); an owner that needs one later reads the trace's spans.")

    @field_validator("replica", mode="before")
    @classmethod
    def _ordinal(cls, value: Any) -> Any:
        """``agentfunnel-2`` → 2: replicas can take their index from a stable host name."""
        if isinstance(value, str) and not value.strip().isdigit():
            head, sep, tail = value.strip().rpartition("-")
            if not sep or not tail.isdigit():
                raise ValueError(f"{value!r} is neither an index nor a name ending in -N")
            return int(tail)
        return value

    @property
    def follow_interval_seconds(self) -> float:
        """How often this replica follows the others: ``poll_interval_seconds``, else as often as they ship."""
        return self.poll_interval_seconds if self.poll_interval_seconds is not None else self.ship_interval_seconds

    @model_validator(mode="after")
    def _in_range(self) -> "LakeSettings":
        if self.replica >= self.replicas:
            raise ValueError(f"replica {self.replica} is out of range for replicas={self.replicas} (0..{self.replicas - 1})")
        if not self.catalog.startswith("postgres:"):
            raise ValueError("catalog must be a PostgreSQL catalog: 'postgres:<conninfo>'")
        if not self.data_path.strip():
            raise ValueError("data_path is empty")
        return self


class StoreSettings(_Model):
    """The DuckDB file (or the shared lake) and how it is written."""

    path: Path = Field(Path("agentfunnel.duckdb"), description="DuckDB database file.")
    max_batch_spans: int = Field(50_000, gt=0, description="Most spans one group commit holds.")
    dedupe_window_seconds: float = Field(
        3600.0, gt=0, description="Retries arriving within this window of the original are recognised."
    )
    dedupe_max_keys: int = Field(1_000_000, gt=0, description="Bound on keys held for duplicate detection (about "
                                 "35 bytes each; at 40k spans/s a million keys still span 25 s, longer than "
                                 "exporters wait before retrying).")
    max_job_delay_seconds: float = Field(
        1.0, ge=0, description="Longest session work waits behind newer ingest before it runs anyway."
    )
    job_share: float = Field(
        0.25, gt=0, le=1, description="Share of the writer's time session work takes while requests are waiting."
    )
    checkpoint_threshold_mb: int = Field(
        128, gt=0, description="Write-ahead log size that triggers a checkpoint into the file. Larger means the "
        "newest row group is compressed and rewritten fewer times (less CPU per span) and a longer log to replay "
        "after a crash (about 0.5 s per 100 MB).",
    )
    admin_port: int = Field(0, ge=0, le=65535, description="Loopback port of the read-only SQL endpoint; 0 picks one.")
    snapshot_path: Path | None = Field(
        None, description="Write a consistent read-only copy of the database here every snapshot_interval_seconds "
        "(as `agentfunnel snapshot` does, replaced whole each time), for tools that open the file themselves.")
    snapshot_interval_seconds: float = Field(3600.0, gt=0, description="How often the periodic snapshot is written.")
    memory_limit_mb: int = Field(
        256, gt=0, description="DuckDB's memory limit (buffer pool: ingest, assembly and SQL together); beyond it "
        "DuckDB spills to temporary files next to the database. Part of the server's memory budget (docs/operations.md; "
        "`agentfunnel -v serve` logs its sum at start).")
    threads: int = Field(2, gt=0, le=256, description="DuckDB's worker threads (ingest commits and SQL share them).")
    rewrite_reader_wait_seconds: float = Field(
        30.0, ge=0, description="How long a rewrite of the file (after `agentfunnel delete`) waits for reads in "
        "progress (SQL, the UI, an export or snapshot) before it interrupts them; new reads wait for the rewrite.")
    accept_damaged_wal: bool = Field(
        False, description="Open the database even when its write-ahead log is shorter than what was committed "
        "to it (cut short or deleted) or an entry's length inside what was committed runs past its end, keeping what "
        "it holds; the log is copied aside first. Off: such a start is "
        "refused (`agentfunnel serve --accept-damaged-wal` sets it for one start).")
    lake: LakeSettings | None = Field(None, description="Ship what is committed in the file to a shared DuckLake "
                                                       "(several replicas); readers read the lake.")

    @field_validator("snapshot_path")
    @classmethod
    def _not_the_database(cls, value: Path | None, info: Any) -> Path | None:
        db = info.data.get("path")
        if value is not None and db is not None and value.resolve() == Path(db).resolve():
            raise ValueError("is the database itself: name another file")
        return value


class SessionSettings(_Model):
    """How traces become sessions."""

    idle_timeout_seconds: float = Field(
        30.0, gt=0, description="A trace is assembled when no span has arrived for it for this long."
    )
    max_open_traces: int = Field(
        100_000, gt=0, description="Bound on traces held open; beyond it the least recently seen close early."
    )
    check_interval_seconds: float = Field(1.0, gt=0, description="How often idle traces are looked for.")
    max_held_bytes: int = Field(
        192 * MiB, gt=0, description="Open traces' spans held in memory, decoded and normalized, until they are "
        "assembled; beyond it (push_back_when_held_full off, or a batch holding more than admission foresaw) the "
        "least recently active are evicted (held_traces_evicted) and read back from the store when they close.")
    push_back_when_held_full: bool = Field(
        True, description="When the spans held for sessions not yet assembled, the batches waiting to be held and "
        "the requests in flight (at what they will hold) reach max_held_bytes, new requests are pushed back (503 / "
        "UNAVAILABLE with Retry-After, counted in pushed_back as <receiver>:held_bytes) until assemblies free room, "
        "so a flood the session stage cannot keep up with neither grows memory nor leaves traces to read back, and "
        "max_held_bytes bounds the requests in flight and the prepare queue too. Its cost: sustained intake of new "
        "traces is at most about max_held_bytes per idle timeout (with the defaults near 3k agent spans/s; bursts up to "
        "max_held_bytes are taken at full speed). false: requests are accepted, and the least recently active "
        "traces are evicted instead and read back from the store when they close (more throughput in a burst, "
        "more memory after it).")
    max_prepare_queue_bytes: int = Field(
        32 * MiB, gt=0, description="Committed batches waiting to be normalized and held, counted at what they hold "
        "decoded (as receivers.max_bytes_in_flight counts them); a batch beyond it is "
        "not held (prepare_skipped) and its traces are read back from the store when they close. Ingest never waits. "
        "With push_back_when_held_full no batch is skipped: the queue counts within max_held_bytes, and "
        "from half of this bound on its worker stops giving way to requests.")
    max_assembled_cache_bytes: int = Field(
        128 * MiB, gt=0, description="Recently assembled traces kept in memory, so a session's next turn is scored "
        "without reading its earlier turns back, each counted at what its records hold (large tool results in "
        "full); beyond it the least recently used go (assembled_cache_evicted).")
    assembly_retry_seconds: float = Field(
        5.0, gt=0, description="After assembling traces failed on an I/O error (a full disk), how long before they are "
        "tried again (traces_assembly_deferred); never while the store cannot commit. A data error is not retried.")
    shutdown_assembly_seconds: float = Field(
        10.0, ge=0, description="At shutdown, open traces are assembled for at most this long; the rest on the next start."
    )
    max_input_bytes: int = Field(
        4 * 1024, gt=0, description="Longest `sessions.input` (the user's first message) kept, in UTF-8 bytes; a longer "
        "one is cut with the usual mark and counted (session_inputs_truncated).")
    max_traces_per_job: int = Field(
        256, gt=0, description="Traces assembled in one store job; larger batches are split so ingest never waits long."
    )
    min_traces_per_job: int = Field(
        256, gt=0, description="Idle traces are assembled in multiples of this many (each store job pays for its "
        "statements however few traces it holds); the rest wait, open, at most max_job_wait_seconds past their idle "
        "timeout.")
    max_job_wait_seconds: float | None = Field(
        None, ge=0, description="The longest an idle trace waits for min_traces_per_job others; unset: 0 on a file of "
        "its own (a trace is assembled as soon as it is idle), store.lake.ship_interval_seconds on a lake (what a "
        "replica writes reaches the lake only as often as it ships).")
    compact_every_seconds: float = Field(
        10.0, gt=0, description="How often the session and case-run rows appended since (session writes are appends) "
        "are folded into one row per session (a job of its own on the store's writer, counted in "
        "session_rows_compacted); the sessions, case_run_results and stage_results views read the same either way, faster with fewer "
        "rows appended.")
    max_versions_remembered: int = Field(
        100_000, gt=0, description="Sessions whose stored version is kept in memory, so scoring one again needs no "
        "lookup; while the store holds no more sessions than this, a session not remembered has no row. Beyond it the "
        "least recently written are forgotten (session_versions_forgotten) and looked up when scored again.")
    max_indexed_sessions_remembered: int = Field(
        20_000, ge=0, description="Sessions whose trace index rows are kept in memory (about 800 bytes each, with "
        "two traces), so a job scoring one again reads nothing of the index; new traces and sessions need no read "
        "either (filters of the ids stored, about 4 MB a million). Beyond it the least recently used are read again "
        "when scored; 0 reads the index every job.")
    open_refresh_seconds: float = Field(
        5.0, ge=0, description="How often sessions still open are (re)written with what is known so far; 0 = never."
    )
    session_keys: list[str] = Field(
        default_factory=list, description="Extra attribute keys that carry a session id, after the built-in ones."
    )
    compiled_path: bool = Field(
        True, description="GenAI-semconv traces are read straight from the request bytes by compiled code and kept "
        "as the few facts sessions need, instead of normalized records (docs/sessions.md); every other trace, and "
        "every trace when privacy redaction, forwarding or a lake is configured, takes the Python path. false: every "
        "trace takes the Python path (the reference; same sessions, slower).")


def parse_headers(value: Any) -> Any:
    """``k=v,k2=v2`` (the OTEL_EXPORTER_OTLP_HEADERS format, values percent-encoded) into a dict."""
    if not isinstance(value, str):
        return value
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in value.split(","))):
        key, sep, val = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"header {item!r} is not key=value")
        out[unquote(key.strip())] = unquote(val.strip())
    return out


class ForwardSettings(_Model):
    """Re-export spans over OTLP to a downstream collector or backend, labelled in ``agentfunnel.*``."""

    endpoint: str = Field(description="gRPC: host:port or http(s)://host:port; HTTP: base URL (/v1/traces is added).")
    protocol: Literal["grpc", "http/protobuf"] = Field("grpc", description="OTLP transport to the downstream.")
    headers: dict[str, str] = Field(default_factory=dict, description="Sent with every request (also \"k=v,k2=v2\").")
    timeout_seconds: float = Field(10.0, gt=0, description="Per export request.")
    insecure: bool = Field(False, description="gRPC without TLS for a bare host:port (http:// implies it).")
    ca_file: Path | None = Field(None, description="PEM roots to verify the downstream's certificate.")
    compression: Literal["gzip", "none"] = Field("gzip", description="Compression of outgoing requests.")
    mode: Literal["immediate", "hold"] = Field(
        "immediate", description="immediate: forward at once, summary span on close; hold: forward sessions labelled on close.")
    queue_max_bytes: int = Field(64 * MiB, gt=0, description="Encoded requests waiting to be sent, and apart from them "
                                 "committed batches waiting to be labelled (at what they hold); the oldest drop first.")
    queue_max_items: int = Field(2048, gt=0, description="Requests waiting to be sent; the oldest drop first.")
    hold_max_bytes: int = Field(128 * MiB, gt=0, description="Hold mode: spans held for open sessions; the oldest go unlabelled.")
    max_request_bytes: int = Field(4 * MiB, gt=0, description="Split outgoing requests above this (gRPC's default limit).")
    max_retry_seconds: float = Field(120.0, ge=0, description="Retryable failures are retried this long, then dropped.")
    shutdown_timeout_seconds: float = Field(5.0, ge=0, description="On stop: how long to keep sending what is queued.")
    also_logs: bool = Field(False, description="Send gen_ai.evaluation.result as OTLP log records too.")
    namespace: Literal["agentfunnel."] = Field("agentfunnel.", description="Fixed: every added attribute's prefix.")

    _headers = field_validator("headers", mode="before")(parse_headers)

    @model_validator(mode="after")
    def _consistent(self) -> "ForwardSettings":
        if not self.endpoint.strip():
            raise ValueError("endpoint is empty")
        if self.ca_file is not None and not self.ca_file.is_file():
            raise ValueError(f"ca_file {self.ca_file} does not exist")
        if self.insecure and self.ca_file is not None:
            raise ValueError("insecure and ca_file contradict each other")
        return self


class CaseSettings(_Model):
    """Evaluation cases: sessions tagged ``agentfunnel.case.id`` are scored against these."""

    suite: str | None = Field(None, description="case file (YAML or TOML): a path or an http(s) URL")
    fallback: Path | None = Field(None, description="local copy used when the URL cannot be fetched")
    archive_dir: Path | None = Field(None, description="write one JSON per case run here")
    fetch_timeout_seconds: float = Field(5.0, gt=0, description="total time for fetching the suite URL (connect, "
                                         "headers, body and redirects); past it the fallback is used")
    max_suite_bytes: int = Field(4 * MiB, gt=0, description="largest suite accepted, fetched or read from a file; "
                                 "a larger URL body counts as a failed fetch")
    allow_remote_commands: bool = Field(False, description="let a suite fetched from a URL declare artifact validators "
                                        "(a command or a module:function this server runs); local suites always may")


class SqlSettings(_Model):
    """The read-only SQL endpoint (``agentfunnel sql``, ``report``, ``compare``): bounds on what one query may cost.

    While a server owns the file, queries run on a DuckDB instance of their own that cannot write
    the store (``collector.sql_sandbox``): no file system, no extensions, configuration locked.
    Read from the file directly, they run on a read-only instance. Results are measured as Arrow
    batches before any Python value is built. Hitting a bound is an error that names it, counted.
    """

    max_rows: int = Field(100_000, gt=0, description="Most rows one query returns; more is an error (add LIMIT).")
    max_result_bytes: int = Field(32 * MiB, gt=0, description="Most bytes (as Arrow batches) one query's result may hold.")
    timeout_seconds: float = Field(30.0, gt=0, description="A query still running after this long is interrupted.")
    max_concurrent: int = Field(4, gt=0, description="Queries the server runs at once; more are refused with 503.")
    memory_limit_mb: int = Field(512, gt=0, description="Memory one query's worker process may use (the SQL "
                                 "endpoint's own DuckDB instance); past it the worker is killed and the query fails.")
    threads: int = Field(2, gt=0, description="DuckDB's threads in each SQL worker process.")
    page_payload_bytes: int = Field(
        4 * MiB, gt=0, description="Bytes of span, tool-call and log payloads (attributes, events, arguments, "
        "results, bodies) the UI's session page shows at once, per kind; a session holding more is shown in parts "
        "with a link to the next (at most max_result_bytes / 8, so a page never hits that bound).")


# The built-in detectors, by the name that switches each on (``collector.privacy.DETECTORS`` holds their patterns).
DetectorName = Literal["email", "phone", "payment_card", "iban", "bearer_token", "api_key", "ip_address"]
_KEY_GLOB = re.compile(r"^[^\s\x00]+$")


class PatternSettings(_Model):
    """A redaction pattern of the user's: every match in a string value becomes ``replacement``."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_]*$", max_length=40,
                      description="Names the pattern in errors and in the redactions counter (pattern:<name>).")
    regex: str = Field(description="A regular expression (Python syntax without backreferences or lookaround: it is "
                       "matched by RE2, in time linear in the text), matched against every string value.")
    replacement: str | None = Field(None, description="What a match becomes (\\1 refers to a group); default "
                                    "privacy.replacement with the pattern's name.")

    @model_validator(mode="after")
    def _compiles(self) -> "PatternSettings":
        try:
            template_check = re.compile(self.regex)  # compiled only to check the replacement; RE2 matches
        except re.error as exc:
            raise ValueError(f"pattern {self.name!r}: {self.regex!r} is not a valid regular expression ({exc})") from None
        try:
            compiled = linear(self.regex, capture=True)
        except ValueError as exc:
            raise ValueError(f"pattern {self.name!r}: {exc}") from None
        if compiled.fullmatch(""):
            raise ValueError(f"pattern {self.name!r}: {self.regex!r} matches the empty string, so it would match "
                             "everywhere")
        if self.replacement is not None:
            try:
                template_check.sub(self.replacement, "")
            except (re.error, IndexError) as exc:
                raise ValueError(f"pattern {self.name!r}: replacement {self.replacement!r} is not usable with its "
                                 f"regex ({exc})") from None
        return self


class PrivacySettings(_Model):
    """Redaction before anything is stored, judged or forwarded; all off by default (and then free)."""

    detectors: list[DetectorName] = Field(
        default_factory=list, description="Built-in detectors to switch on: email, phone, payment_card (Luhn-checked), "
        "iban (mod-97-checked), bearer_token, api_key, ip_address.")
    patterns: list[PatternSettings] = Field(default_factory=list, description="Patterns of your own, with replacements.")
    drop_keys: list[str] = Field(default_factory=list, description="Attribute keys removed (`*` matches any run of "
                                 "characters, e.g. `http.request.header.*`).")
    hash_keys: list[str] = Field(default_factory=list, description="Attribute keys whose values are replaced by a keyed "
                                 "hash (HMAC-SHA256, truncated hex), so ids such as `user.id` stay joinable.")
    hash_key: SecretStr | None = Field(None, description="The hash key; set it from AGENTFUNNEL_HASH_KEY rather than a "
                                       "file. Required with hash_keys; never logged.")
    hash_length: int = Field(16, ge=8, le=64, description="Hex characters kept of each hash.")
    capture_content: bool = Field(True, description="false: drop message content and tool payloads (arguments, "
                                  "results, prompts, answers), keep the structure (spans, tool names, steps, status, "
                                  "tokens).")
    replacement: str = Field("[redacted:{name}]", description="What a detector's match becomes; {name} is the "
                             "detector's name.")

    @field_validator("drop_keys", "hash_keys")
    @classmethod
    def _keys(cls, value: list[str]) -> list[str]:
        for key in value:
            if not _KEY_GLOB.match(key) or key.strip("*") == "":
                raise ValueError(f"{key!r} is not an attribute key (or a key with * wildcards)")
        return value

    @field_validator("replacement")
    @classmethod
    def _replacement(cls, value: str) -> str:
        try:
            value.format(name="x")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"{value!r}: only {{name}} may be filled in ({exc})") from None
        return value

    @model_validator(mode="after")
    def _hashing(self) -> "PrivacySettings":
        if self.hash_keys and (self.hash_key is None or not self.hash_key.get_secret_value()):
            raise ValueError("hash_keys needs hash_key (set AGENTFUNNEL_HASH_KEY)")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.detectors or self.patterns or self.drop_keys or self.hash_keys or not self.capture_content)


# Tables by what they hold: raw telemetry, and rows derived from it (re-derivable while the raw rows last).
# The trace index goes with the spans of its traces.
RAW_TABLES = ("spans", "logs", "metrics", "feedback")
DERIVED_TABLES = ("tool_calls", "sessions", "case_runs", "judgments")
TableName = Literal["spans", "logs", "metrics", "feedback", "tool_calls", "sessions", "case_runs", "judgments"]


class RetentionSettings(_Model):
    """How long rows are kept; pruned by bounded store jobs off the ingest path. Nothing is pruned by default."""

    raw_days: float | None = Field(None, gt=0, description="Spans, log records, metric points and user feedback older than this "
                                   "(by their own time) are removed; a trace's index row goes with its last span.")
    derived_days: float | None = Field(None, gt=0, description="Tool calls and sessions older than this are removed "
                                       "(by their start and last span), case runs and judgments with their sessions.")
    tables: dict[TableName, float] = Field(default_factory=dict, description="A time-to-live in days for one table, "
                                           "overriding raw_days or derived_days.")
    interval_seconds: float = Field(3600.0, gt=0, description="How often the server prunes.")
    max_future_seconds: float = Field(86400.0, gt=0, description="A span, log record or metric point dated more than "
                                      "this after it arrived (a clock ahead) is counted in spans_future_dated (spans) "
                                      "and aged by its arrival time instead of its own; so is a session whose last "
                                      "span is, with its tool calls.")
    max_rows_per_job: int = Field(50_000, gt=0, description="Most rows one pruning job removes; more take more jobs, "
                                  "so ingest waits at most one job (counted in prune_jobs).")

    @field_validator("tables")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        for table, days in value.items():
            if not days > 0:
                raise ValueError(f"{table}: {days} days is not a time-to-live (give a number above 0)")
        return value

    def ttl_days(self) -> dict[str, float]:
        """Each table's time-to-live in days, for the tables that have one."""
        out = {t: self.raw_days for t in RAW_TABLES if self.raw_days is not None}
        out.update({t: self.derived_days for t in DERIVED_TABLES if self.derived_days is not None})
        out.update(self.tables)  # type: ignore[arg-type]  # a table's name is a str
        return out


class AdminSettings(_Model):
    """Who may administer the running server, where its admin requests may write, and how often the UI's sign-in
    may be tried.

    Two credentials: ``receivers.bearer_token`` only sends telemetry; ``admin.token`` (or the per-process secret in
    the 0600 sidecar, which agentfunnel's commands read) runs the admin endpoint and reads the UI.
    """

    token: str | None = Field(None, description="The admin credential: `Authorization: Bearer <token>` on the admin "
                              "endpoint (/sql, /flush, /rescore, /judge, /audit/labels, /prune, /delete, /export, "
                              "/snapshot) and the UI's sign-in. Unset, only the sidecar's secret (this user's "
                              "commands) administers the server, and the UI answers loopback clients only.")
    write_dirs: list[Path] = Field(default_factory=list, description="Directories besides the database's own where "
                                   "/snapshot and /export may write; any other target is refused.")
    sign_in_per_minute: int = Field(10, gt=0, description="UI sign-in attempts one client address may make per "
                                    "minute; more are answered 429 with Retry-After (counted in ui_sign_in as "
                                    "limited).")

    @field_validator("token")
    @classmethod
    def _long_enough(cls, value: str | None) -> str | None:
        if value is not None and len(value) < 8:
            raise ValueError("is shorter than 8 characters: give a random token (e.g. `openssl rand -hex 32`)")
        return value

    @field_validator("write_dirs")
    @classmethod
    def _absolute(cls, value: list[Path]) -> list[Path]:
        for d in value:
            if not d.is_absolute():
                raise ValueError(f"{d} is not an absolute path")
        return value


class UISettings(_Model):
    """What the web UI draws from telemetry: JSON shown as folding trees, within bounds."""

    max_json_tree_bytes: int = Field(64 * 1024, gt=0, description="A JSON value (attributes, tool arguments and "
                                     "results, message parts) larger than this is shown as plain text, not a tree.")
    max_json_tree_depth: int = Field(12, gt=0, le=64, description="Levels of a JSON tree shown as folding nodes; "
                                     "deeper values are shown as compact JSON text.")
    max_json_tree_page_bytes: int = Field(1 * MiB, gt=0, description="JSON bytes one page shows as trees; values "
                                          "past this are shown as plain text.")
    review_experiments: str = Field("*", min_length=1, description="The review queue samples the judge's calls on "
                                    "the experiments this glob names (as `judge audit export --experiment`).")
    review_sample: int = Field(40, gt=0, le=10_000, description="Judge calls the review queue samples, stratified by "
                               "criterion and the judge's call (as `judge audit export --sample`).")
    review_firings: int = Field(20, ge=0, le=1_000, description="The latest monitor firings whose sessions enter the "
                                "review queue.")
    review_firing_sessions: int = Field(100, ge=0, le=10_000, description="Most sessions the firings bring into the "
                                        "review queue (newest firings first).")
    max_write_bytes: int = Field(16 * 1024, gt=0, le=1 * MiB, description="Largest form a UI write (a review label, "
                                 "a case draft) may post; a larger one is answered 413 unread (counted in "
                                 "ui_writes_refused as too_large).")


class FeedbackSettings(_Model):
    """User feedback (thumbs, scores, comments) over OTLP and ``POST /v1/feedback``: what counts as feedback, how
    it reads as positive or negative, and what one item or request may hold."""

    evaluation_names: list[str] = Field(["user_feedback"], description="`gen_ai.evaluation.result` events (span "
                                        "events or log records) whose `gen_ai.evaluation.name` is one of these "
                                        "(case-insensitive) are user feedback; an event with "
                                        "`agentfunnel.feedback.source` is feedback whatever its name.")
    max_comment_chars: int = Field(2000, gt=0, description="A comment (`gen_ai.evaluation.explanation`) longer than "
                                   "this is cut (counted in feedback_truncated).")
    max_field_chars: int = Field(256, gt=0, description="Ids, names and labels longer than this are cut (counted in "
                                 "feedback_truncated).")
    max_body_bytes: int = Field(256 * 1024, gt=0, description="Largest body POST /v1/feedback reads; a larger one is "
                                "answered 413 unread.")
    max_items_per_request: int = Field(100, gt=0, description="Most items one POST /v1/feedback may hold; more is "
                                       "answered 400 (counted in feedback_rejected as too_many).")
    positive_at: float = Field(0.7, ge=0, le=1, description="A score with no known label reads positive at this "
                               "share of its scale or above (4 of 5 stars, a thumbs up of 1).")
    negative_at: float = Field(0.4, ge=0, le=1, description="A score with no known label reads negative at this "
                               "share of its scale or below (2 of 5 stars, a thumbs down of 0 or -1); between the "
                               "two it is neutral.")
    positive_labels: list[str] = Field(["up", "thumbs_up", "positive", "good", "helpful", "like", "yes", "pass"],
                                       description="Labels (`gen_ai.evaluation.score.label`, case-insensitive) that "
                                       "read positive, whatever the score.")
    negative_labels: list[str] = Field(["down", "thumbs_down", "negative", "bad", "unhelpful", "dislike", "no",
                                        "fail"], description="Labels that read negative, whatever the score.")

    @model_validator(mode="after")
    def _ordered(self) -> "FeedbackSettings":
        if self.negative_at >= self.positive_at:
            raise ValueError(f"negative_at ({self.negative_at}) must be below positive_at ({self.positive_at})")
        if not self.evaluation_names:
            raise ValueError("evaluation_names is empty: name at least one evaluation that is user feedback")
        return self


class IngestSettings(_Model):
    """``agentfunnel ingest`` sending files to the running server: how it retries when pushed back."""

    retry_seconds: float = Field(
        300.0, ge=0, description="How long a body the running server pushes back (429 / 503) is retried, as an OTLP "
        "exporter retries, before the command gives up on it and on the bodies after it (exit 1; running it again "
        "sends them, and what was stored already is recognised as retries). 0: not retried.")
    max_retry_wait_seconds: float = Field(
        10.0, gt=0, description="The longest one wait between retries, whatever the server's Retry-After asks; "
        "without a Retry-After the waits start at 1 s and double up to it.")


class Settings(_Model):
    """Everything ``agentfunnel serve`` and ``agentfunnel ingest`` read."""

    receivers: ReceiverSettings = ReceiverSettings()
    store: StoreSettings = StoreSettings()
    sessions: SessionSettings = SessionSettings()
    scoring: ScoringConfig = ScoringConfig()
    forward: ForwardSettings | None = None  # off unless configured
    cases: CaseSettings = CaseSettings()
    judge: JudgeSettings = JudgeSettings()
    sql: SqlSettings = SqlSettings()
    privacy: PrivacySettings = PrivacySettings()
    retention: RetentionSettings = RetentionSettings()
    admin: AdminSettings = AdminSettings()
    ui: UISettings = UISettings()
    monitors: MonitorSettings = MonitorSettings()
    feedback: FeedbackSettings = FeedbackSettings()
    ingest: IngestSettings = IngestSettings()

    @model_validator(mode="after")
    def _two_credentials(self) -> "Settings":
        if self.admin.token is not None and self.admin.token == self.receivers.bearer_token:
            raise ValueError("admin.token is the same as receivers.bearer_token, which every agent holds: give the "
                             "admin a token of its own")
        return self


class ConfigError(Exception):
    """A config file, variable or flag that cannot be used; the message names the field."""


ENV_VARS = {
    "AGENTFUNNEL_DB": ("store", "path"),
    "AGENTFUNNEL_HOST": ("receivers", "host"),
    "AGENTFUNNEL_BEARER_TOKEN": ("receivers", "bearer_token"),
    "AGENTFUNNEL_ADMIN_TOKEN": ("admin", "token"),
    "AGENTFUNNEL_HASH_KEY": ("privacy", "hash_key"),
    "AGENTFUNNEL_LAKE_CATALOG": ("store", "lake", "catalog"),
    "AGENTFUNNEL_LAKE_DATA_PATH": ("store", "lake", "data_path"),
    "AGENTFUNNEL_LAKE_REPLICA": ("store", "lake", "replica"),
    "AGENTFUNNEL_LAKE_REPLICAS": ("store", "lake", "replicas"),
}


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path} is not valid {'TOML' if path.suffix == '.toml' else 'YAML'}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"  {where}: {msg}")
    return "\n".join(lines)


def load_settings(config_file: Path | None = None, overrides: dict[tuple[str, ...], Any] | None = None,
                  environ: dict[str, str] | None = None) -> Settings:
    """Merge file, environment and flags into validated Settings, or raise ConfigError."""
    data = _read_file(config_file) if config_file else {}
    env = os.environ if environ is None else environ
    for var, path in ENV_VARS.items():
        if env.get(var):
            _set(data, path, env[var])
    for path, value in (overrides or {}).items():
        if value is not None:
            _set(data, path, value)
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(config_file or "settings"))) from None
