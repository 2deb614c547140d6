"""One mapping from ingest errors to OTLP answers: HTTP statuses and gRPC codes.

Malformed data is permanent (400 / INVALID_ARGUMENT), never INTERNAL; saturation is retryable
(503 with Retry-After / UNAVAILABLE with RetryInfo), as the OTLP specification asks.
"""

from __future__ import annotations

import hmac
import math

import grpc
from google.protobuf import duration_pb2
from google.protobuf.any_pb2 import Any as AnyProto
from google.rpc import code_pb2, error_details_pb2, status_pb2

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (ExportLogsPartialSuccess,
                                                                    ExportLogsServiceResponse)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (ExportMetricsPartialSuccess,
                                                                          ExportMetricsServiceResponse)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTracePartialSuccess,
                                                                      ExportTraceServiceResponse)

from ..errors import (BodyTimeout, IngestError, PayloadTooLarge, PermanentError, RetryableError, UnauthorizedError,
                      UnsupportedMedia)


def check_bearer(header: str | None, token: str | None) -> None:
    """The same bearer-token rule for both receivers (HTTP header, gRPC metadata)."""
    if token is None:
        return
    if header is None:
        raise UnauthorizedError("missing Authorization header (expected a bearer token)")
    scheme, _, value = header.partition(" ")
    # compared in constant time: how long a refusal takes says nothing about how much of a guess was right
    if not hmac.compare_digest(value.strip().encode(), token.encode()) or scheme.lower() != "bearer":
        raise UnauthorizedError("invalid bearer token")


def export_response(signal: str, rejected: int, message: str) -> bytes:
    """Serialized Export*ServiceResponse; partial_success only when something was refused."""
    if signal == "traces":
        resp = ExportTraceServiceResponse()
        if rejected:
            resp.partial_success.CopyFrom(ExportTracePartialSuccess(rejected_spans=rejected, error_message=message))
    elif signal == "metrics":
        resp = ExportMetricsServiceResponse()
        if rejected:
            resp.partial_success.CopyFrom(ExportMetricsPartialSuccess(rejected_data_points=rejected,
                                                                      error_message=message))
    else:
        resp = ExportLogsServiceResponse()
        if rejected:
            resp.partial_success.CopyFrom(ExportLogsPartialSuccess(rejected_log_records=rejected,
                                                                   error_message=message))
    return resp.SerializeToString()


def http_status(exc: IngestError) -> int:
    if isinstance(exc, PayloadTooLarge):
        return 413
    if isinstance(exc, UnsupportedMedia):
        return 415
    if isinstance(exc, UnauthorizedError):
        return 401
    if isinstance(exc, BodyTimeout):
        return 408
    if isinstance(exc, PermanentError):
        return 400
    return 503


def grpc_code(exc: IngestError) -> grpc.StatusCode:
    if isinstance(exc, PayloadTooLarge):
        return grpc.StatusCode.RESOURCE_EXHAUSTED  # no RetryInfo: clients do not retry it
    if isinstance(exc, UnauthorizedError):
        return grpc.StatusCode.UNAUTHENTICATED
    if isinstance(exc, PermanentError):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.UNAVAILABLE


def rpc_status(exc: IngestError) -> status_pb2.Status:
    """google.rpc.Status for the error, with RetryInfo when a retry is invited."""
    code = {
        grpc.StatusCode.RESOURCE_EXHAUSTED: code_pb2.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNAUTHENTICATED: code_pb2.UNAUTHENTICATED,
        grpc.StatusCode.INVALID_ARGUMENT: code_pb2.INVALID_ARGUMENT,
        grpc.StatusCode.UNAVAILABLE: code_pb2.UNAVAILABLE,
    }[grpc_code(exc)]
    status = status_pb2.Status(code=code, message=exc.message)
    if isinstance(exc, RetryableError):
        info = error_details_pb2.RetryInfo(retry_delay=_duration(exc.retry_after_s))
        detail = AnyProto()
        detail.Pack(info)
        status.details.append(detail)
    return status


def retry_after_header(exc: IngestError) -> str | None:
    if isinstance(exc, RetryableError):
        return str(max(1, math.ceil(exc.retry_after_s)))
    return None


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d
