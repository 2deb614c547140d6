"""Forwarding downstream (optional): spans re-exported over OTLP with ``agentfunnel.*`` labels.

``Forwarder`` is the stage (listeners, worker, exporter); ``encode`` rebuilds OTLP requests from
stored columns; ``enrich`` decides what each span and the session summary carry; ``hold`` keeps
spans until their session closes (hold mode).
"""

from .encode import OutSpan, chunked, encode_traces, rows_of
from .forwarder import Forwarder

__all__ = ["Forwarder", "OutSpan", "chunked", "encode_traces", "rows_of"]
