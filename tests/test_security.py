"""Bearer token and TLS on both receivers, with the real SDK exporters."""

from __future__ import annotations

import subprocess

import grpc

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace import TracerProvider

from conftest import sql


def _span(name: str) -> ReadableSpan:
    tp = TracerProvider()
    with tp.get_tracer("t").start_as_current_span(name) as span:
        pass
    return span  # type: ignore[return-value]


def test_bearer_token_required_on_both_receivers(server_factory):
    srv = server_factory(env={"AGENTFUNNEL_BEARER_TOKEN": "s3cret"})
    auth = {"authorization": "Bearer s3cret"}
    assert HttpSpanExporter(endpoint=srv.http_url + "/v1/traces").export([_span("no-token-http")]) == SpanExportResult.FAILURE
    assert GrpcSpanExporter(endpoint=srv.grpc, insecure=True, timeout=5).export([_span("no-token-grpc")]) == SpanExportResult.FAILURE
    assert HttpSpanExporter(endpoint=srv.http_url + "/v1/traces", headers=auth).export([_span("ok-http")]) == SpanExportResult.SUCCESS
    assert GrpcSpanExporter(endpoint=srv.grpc, insecure=True, headers=auth).export([_span("ok-grpc")]) == SpanExportResult.SUCCESS
    # the SQL endpoint uses the same token, which the CLI reads from the sidecar
    assert sorted(r["name"] for r in sql(srv.db, "select name from spans")) == ["ok-grpc", "ok-http"]


def test_tls_on_both_receivers(server_factory, tmp_path, monkeypatch):
    # requests prefers a CA bundle named in the environment over the exporter's certificate_file
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    cfg = tmp_path / "tls.yaml"
    cfg.write_text(f"receivers:\n  tls:\n    cert_file: {cert}\n    key_file: {key}\n")
    srv = server_factory(["--config", str(cfg)])
    http_exp = HttpSpanExporter(endpoint=f"https://{srv.http}/v1/traces", certificate_file=str(cert))
    assert http_exp.export([_span("tls-http")]) == SpanExportResult.SUCCESS
    grpc_exp = GrpcSpanExporter(endpoint=f"https://{srv.grpc}", insecure=False,
                                credentials=grpc.ssl_channel_credentials(root_certificates=cert.read_bytes()))
    assert grpc_exp.export([_span("tls-grpc")]) == SpanExportResult.SUCCESS
    plain = HttpSpanExporter(endpoint=f"http://{srv.http}/v1/traces", timeout=3)
    assert plain.export([_span("plain")]) == SpanExportResult.FAILURE
    assert sorted(r["name"] for r in sql(srv.db, "select name from spans")) == ["tls-grpc", "tls-http"]
