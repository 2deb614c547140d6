"""OTLP/gRPC: TraceService/Export and LogsService/Export.

Requests arrive as raw bytes (no deserializer registered), so a malformed payload is decoded by
us and answered INVALID_ARGUMENT with a message, never INTERNAL. Saturation is UNAVAILABLE with
RetryInfo; an acknowledged request has been committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc

from ..config import ReceiverSettings
from ..errors import IngestError
from ..pipeline import ExportResult, Pipeline, Signal
from ..telemetry import Metrics
from .status import check_bearer, export_response, grpc_code, rpc_status

TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"


class GrpcReceiver:
    """The grpc.aio server behind the OTLP/gRPC port."""

    def __init__(self, settings: ReceiverSettings, pipeline: Pipeline, metrics: Metrics,
                 run_blocking: Callable[..., Awaitable]) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.metrics = metrics
        self.run_blocking = run_blocking
        self.server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", settings.max_request_bytes),
            ("grpc.max_send_message_length", 4 * 1024 * 1024),
        ])
        self.server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler(
                TRACE_SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(self._traces)}),
            grpc.method_handlers_generic_handler(
                LOGS_SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(self._logs)}),
        ))

    def bind(self, host: str) -> int:
        address = f"{host}:{self.settings.grpc_port}"
        tls = self.settings.tls
        if tls:
            creds = grpc.ssl_server_credentials([(tls.key_file.read_bytes(), tls.cert_file.read_bytes())])
            port = self.server.add_secure_port(address, creds)
        else:
            port = self.server.add_insecure_port(address)
        if port == 0:
            raise OSError(f"cannot listen for OTLP/gRPC on {address}")
        return port

    async def _traces(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._export(request, context, "traces")

    async def _logs(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._export(request, context, "logs")

    async def _export(self, body: bytes, context: grpc.aio.ServicerContext, signal: Signal) -> bytes:
        reserved = 0
        try:
            check_bearer(dict(context.invocation_metadata() or ()).get("authorization"), self.settings.bearer_token)
            self.pipeline.admission.acquire(len(body), "grpc")
            reserved = len(body)
            batch = await self.run_blocking(self.pipeline.decode, signal, "protobuf", body)
            result: ExportResult = await asyncio.wrap_future(self.pipeline.submit(batch, "grpc"))
        except IngestError as exc:
            self.pipeline.count_refusal(signal, exc)
            status = rpc_status(exc)
            await context.abort(grpc_code(exc), exc.message,
                                trailing_metadata=(("grpc-status-details-bin", status.SerializeToString()),))
            raise AssertionError("unreachable")  # abort raises
        finally:
            if reserved:
                self.pipeline.admission.release(reserved)
        self.metrics.inc("requests", label=f"{signal}:ok")
        return export_response(signal, result.rejected, result.message)
