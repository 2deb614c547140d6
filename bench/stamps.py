"""What stamping assembled spans with their session and dialect costs a session job, per span.

A session job stamps every span of the traces it assembled (``SessionTables.write_assembled``): an
UPDATE of the stored rows, then the job's COMMIT writes the changed rows to the log. A trace whose
spans share one session and one dialect is stamped with one row for the whole trace; a trace whose
spans differ, a row per span. This commits ``--jobs`` jobs of ``--spans`` spans each (GenAI-shaped
requests, ``payloads.genai_request``) into a fresh store file, then stamps each job's traces both
ways, alternating which goes first, and prints the writer thread's CPU per span for each (the
UPDATE and its COMMIT; checkpoints held off, so that neither pays for the other's).

This is a by-hand benchmark, never part of the test suite. Run it from the repository root:

    python bench/stamps.py
    python bench/stamps.py --jobs 60 --spans 4096
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from payloads import genai_request_bytes  # noqa: E402

from agentfunnel.collector.assembly import AssembledTrace, assemble, span_stamps  # noqa: E402
from agentfunnel.collector.decode import decode_traces_protobuf  # noqa: E402
from agentfunnel.collector.store.schema import append_arrow, describe, migrate, transaction  # noqa: E402
from agentfunnel.collector.store.session_tables import SessionTables  # noqa: E402
from agentfunnel.collector.store.writer import Store, connect  # noqa: E402
from agentfunnel.semconv import SpanView  # noqa: E402


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=40, help="jobs, stamped half one way and half the other")
    ap.add_argument("--spans", type=int, default=2048, help="spans a job assembled")
    args = ap.parse_args()
    tables = SessionTables()
    with tempfile.TemporaryDirectory() as tmp:
        con = connect(Path(tmp) / "stamps.duckdb")
        migrate(con)
        con.execute("SET checkpoint_threshold = '100GB'")
        columns = list(describe(con, "spans"))
        jobs: list[tuple[datetime, list[AssembledTrace]]] = []
        for job in range(args.jobs):
            received = datetime.now(timezone.utc)
            b = decode_traces_protobuf(genai_request_bytes(args.spans, seed=job))
            append_arrow(con, "spans", Store._span_table([(b, None)], received), columns)
            by_trace: dict[str, list[SpanView]] = {}
            for i in range(len(b)):
                by_trace.setdefault(b.trace_id[i], []).append(SpanView(
                    b.trace_id[i], b.span_id[i], b.parent_span_id[i], b.name[i], b.attrs[i], b.resource_attrs[i],
                    list(b.event_list[i] or []), b.kind[i], b.status_code[i], b.status_message[i], b.scope_name[i],
                    b.start_ns[i], b.end_ns[i]))
            traces = [assemble(views) for views in by_trace.values()]
            # one session a trace, as an agent's turn is
            jobs.append((received.replace(tzinfo=None) - timedelta(seconds=1),
                         [AssembledTrace(t.trace_id, t.records, dict.fromkeys(t.sessions, f"session-{t.trace_id[:8]}"))
                          for t in traces]))
        cpu = {"a row a trace": 0.0, "a row a span": 0.0}
        spans = dict.fromkeys(cpu, 0)
        for n, (since, traces) in enumerate(jobs):
            whole = span_stamps(traces)
            by_span = [{**s, "span_id": r.span_id} for t, s in zip(traces, whole) for r in t.records]
            assert len(whole) == len(traces), "every trace of the bench's requests is stamped whole"
            way = list(cpu)[(n + n // 2) % 2]
            started = _cpu()
            with transaction(con):
                tables.write_assembled(con, since, [], whole if way == "a row a trace" else by_span, [])
            cpu[way] += _cpu() - started
            spans[way] += sum(len(t.records) for t in traces)
        stamped = con.execute("SELECT count(*) FILTER (WHERE dialect IS NOT NULL), count(*) FROM spans").fetchone()
        assert stamped[0] == stamped[1], stamped
        print(f"{args.jobs} jobs of {args.spans:,} spans: "
              + "; ".join(f"{way}: {cpu[way] / spans[way] * 1e6:.2f} us/span" for way in cpu))


if __name__ == "__main__":
    main()
