"""OTLP/gRPC: TraceService/Export, LogsService/Export and MetricsService/Export.

Requests arrive as raw bytes (no deserializer registered), so a malformed payload is decoded by
us and answered INVALID_ARGUMENT with a message, never INTERNAL. Saturation is UNAVAILABLE with
RetryInfo; an acknowledged request has been committed.

Export is registered as a client-streaming method although clients call it as a unary one (the
wire is the same): so the handler runs as soon as the call's metadata has arrived, and the token,
the cap on calls in progress and admission are checked before a byte of the message is read.
A refused call costs the server nothing but its headers, whatever size its message would be.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from ..config import ReceiverSettings
from ..errors import BodyTimeout, IngestError, PermanentError, Saturated
from ..decoded import decoded_cost
from ..pipeline import ExportResult, Pipeline, Signal
from ..telemetry import Metrics
from .status import check_bearer, export_response, grpc_code, rpc_status

TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"


class GrpcReceiver:
    """The grpc.aio server behind the OTLP/gRPC port."""

    def __init__(self, settings: ReceiverSettings, pipeline: Pipeline, metrics: Metrics,
                 run_blocking: Callable[..., Awaitable]) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.metrics = metrics
        self.run_blocking = run_blocking
        self._in_progress = 0
        self.server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", settings.max_request_bytes),
            ("grpc.max_send_message_length", 4 * 1024 * 1024),
            ("grpc.max_concurrent_streams", settings.max_concurrent_requests),
            ("grpc.server_handshake_timeout_ms", int(settings.header_timeout_seconds * 1000)),
            ("grpc.max_connection_idle_ms", int(settings.idle_timeout_seconds * 1000)),
            # grpcio sets SO_REUSEPORT by default: a second server on the same port would start
            # silently and the kernel would split the agents' connections between the two
            ("grpc.so_reuseport", 0),
        ])
        self.server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler(
                TRACE_SERVICE, {"Export": grpc.stream_unary_rpc_method_handler(self._traces)}),
            grpc.method_handlers_generic_handler(
                LOGS_SERVICE, {"Export": grpc.stream_unary_rpc_method_handler(self._logs)}),
            grpc.method_handlers_generic_handler(
                METRICS_SERVICE, {"Export": grpc.stream_unary_rpc_method_handler(self._metrics)}),
        ))
        metrics.gauge("grpc_calls_in_progress", lambda: self._in_progress)

    def bind(self, host: str) -> int:
        """Bind the port (exclusively: no SO_REUSEPORT) and return it; ``OSError`` (no errno) when it fails.

        gRPC does not say why a bind failed (the caller checks the port itself first, so this is
        the rare race or an address gRPC cannot use); older grpcio returns 0, newer raises.
        """
        bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host  # an IPv6 address
        address = f"{bracketed}:{self.settings.grpc_port}"
        tls = self.settings.tls
        try:
            if tls:
                creds = grpc.ssl_server_credentials([(tls.key_file.read_bytes(), tls.cert_file.read_bytes())])
                port = self.server.add_secure_port(address, creds)
            else:
                port = self.server.add_insecure_port(address)
        except RuntimeError:
            port = 0
        if port == 0:
            raise OSError(f"gRPC could not bind {address}")
        return port

    async def _traces(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        return await self._export(requests, context, "traces")

    async def _logs(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        return await self._export(requests, context, "logs")

    async def _metrics(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        return await self._export(requests, context, "metrics")

    def _admit_call(self) -> None:
        """Before the message is read: the caller's token, the calls in progress, the bytes in flight."""
        if self._in_progress >= self.settings.max_concurrent_requests:
            self.metrics.inc("pushed_back", label="grpc:max_concurrent_requests")
            raise Saturated(f"{self._in_progress} calls in progress (receivers.max_concurrent_requests); "
                            f"retry after {self.settings.retry_after_seconds:g}s", self.settings.retry_after_seconds)
        self.pipeline.admission.check("grpc")
        if self.pipeline.admission.saturated():
            self.metrics.inc("pushed_back", label="grpc:bytes_in_flight")
            raise Saturated(f"{self.pipeline.admission.in_flight} bytes in flight, limit {self.pipeline.admission.limit}; "
                            f"retry after {self.settings.retry_after_seconds:g}s", self.settings.retry_after_seconds)

    def _reserve(self, reserved: int, cost: int) -> int:
        """Hold ``cost`` bytes in admission for a request holding ``reserved``; what it holds now."""
        if cost > reserved:
            self.pipeline.admission.acquire(cost - reserved, "grpc", held=reserved)
        return max(cost, reserved)

    async def _read_one(self, requests: AsyncIterator[bytes]) -> bytes:
        body: bytes | None = None
        try:
            async with asyncio.timeout(self.settings.body_timeout_seconds):
                async for message in requests:
                    if body is not None:
                        raise PermanentError("Export takes exactly one request message")
                    body = message
        except TimeoutError:
            raise BodyTimeout(f"the request message did not arrive within {self.settings.body_timeout_seconds:g}s "
                              "(receivers.body_timeout_seconds)") from None
        return body or b""

    async def _export(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext, signal: Signal) -> bytes:
        reserved = 0
        counted = False
        try:
            check_bearer(dict(context.invocation_metadata() or ()).get("authorization"), self.settings.bearer_token)
            self._admit_call()
            self._in_progress += 1
            counted = True
            body = await self._read_one(requests)
            self.pipeline.admission.acquire(len(body), "grpc")
            reserved = len(body)
            shape = None
            if signal == "metrics":  # admitted at what it decodes to, before decoding
                shape = await self.run_blocking(self.pipeline.measure, signal, "protobuf", body)
                if shape is not None:
                    reserved = self._reserve(reserved, shape.decoded_cost(len(body)))
            batch = await self.run_blocking(self.pipeline.decode, signal, "protobuf", body, shape)
            del body
            reserved = self._reserve(reserved, decoded_cost(batch))  # decoded, it may cost more than its bytes
            result: ExportResult = await asyncio.wrap_future(self.pipeline.submit(batch, "grpc"))
        except IngestError as exc:
            self.pipeline.count_refusal(signal, exc)
            # The status is set and the handler returns; ``context.abort`` would raise an exception that the call's
            # state keeps (state -> exception -> traceback -> this frame -> context -> state): a cycle only the
            # cyclic collector frees, and with the call the message its client had already sent. A flood of
            # refused calls held hundreds of MiB that way (bench/overload.py).
            context.set_code(grpc_code(exc))
            context.set_details(exc.message)
            context.set_trailing_metadata((("grpc-status-details-bin", rpc_status(exc).SerializeToString()),))
            return b""
        finally:
            if counted:
                self._in_progress -= 1
            if reserved:
                self.pipeline.admission.release(reserved)
        self.metrics.inc("requests", label=f"{signal}:ok")
        return export_response(signal, result.rejected, result.message)
