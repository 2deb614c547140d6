"""Monitors in a real ``agentfunnel serve``: a new agent version's drop in conversion fires to a real local
webhook (a 503 first, retried and counted), is stored, shown on /metrics and not repeated; the same drop on
a slice too small for it to be significant does not fire."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import run_cli, sql
from otlp_build import to_otlp_json_bytes, trace_request


class Receiver:
    """A webhook on port 0 that answers 503 to its first POST and 200 after, keeping each body."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                self.send_response(503 if len(outer.bodies) == 1 else 200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


def _session(sid: str, agent: str, version: str, details: bool, at: int) -> list[dict]:
    trace, root = os.urandom(16), os.urandom(8)
    base = {"gen_ai.conversation.id": sid}
    spans = [{"trace_id": trace, "span_id": root, "name": f"invoke_agent {agent}", "start": at, "end": at + 900_000_000,
              "attributes": {**base, "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent,
                             "gen_ai.agent.version": version}}]
    for i, tool in enumerate(["search_products"] + (["get_product_details"] if details else [])):
        spans.append({"trace_id": trace, "span_id": os.urandom(8), "parent_span_id": root, "name": f"execute_tool {tool}",
                      "start": at + (i + 1) * 100_000_000, "end": at + (i + 1) * 100_000_000 + 50_000_000,
                      "attributes": {**base, "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                                     "gen_ai.tool.call.arguments": json.dumps({"query": "shoes"}),
                                     "gen_ai.tool.call.result": json.dumps({"products": [{"id": "p1"}]})}})
    return spans


def _population() -> list[dict]:
    """shop: 36 of 40 sessions reach details on 1.0, 12 of 40 on 2.0; kiosk: 8 of 10, then 5 of 10."""
    now = time.time_ns() - 600 * 10**9
    spans: list[dict] = []
    plan = [("shop", "1.0", 40, 36), ("kiosk", "1.0", 10, 8), ("shop", "2.0", 40, 12), ("kiosk", "2.0", 10, 5)]
    n = 0
    for agent, version, total, reached in plan:
        for i in range(total):
            n += 1
            spans += _session(f"{agent}-{version}-{i}", agent, version, i < reached, now + n * 2 * 10**9)
    return spans


def test_a_new_versions_drop_fires_to_the_webhook_once_and_a_small_sample_does_not(server_factory, tmp_path):
    hook = Receiver()
    rule = {"measure": {"kind": "step_conversion", "variant": "shopping", "step": "details"}, "window": "1d",
            "condition": {"against": "previous_version", "direction": "decrease"}, "min_sample": 10}
    config = tmp_path / "monitors.yaml"  # JSON is YAML
    config.write_text(json.dumps({"monitors": {
        "interval_seconds": 3600, "alpha": 0.01,
        "webhook": {"url": hook.url, "timeout_seconds": 5, "retries": 2, "backoff_seconds": 0},
        "rules": [{"name": "shop-details", "slice": {"agent": "shop"}, **rule},
                  {"name": "kiosk-details", "slice": {"agent": "kiosk"}, **rule}]}}))
    try:
        srv = server_factory(["--config", str(config)])
        body = to_otlp_json_bytes(trace_request(_population(), {"service.name": "shop"}))
        req = urllib.request.Request(srv.http_url + "/v1/traces", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
        srv.admin_post("/flush")
        out = run_cli("monitors", "check", "--db", str(srv.db), "--config", str(config)).stdout
        assert "fired shop-details: conversion to shopping/details went from 90.0%" in out, out
        assert "kiosk-details" not in out and "2 rule(s) checked, 1 fired" in out
        assert len(hook.bodies) == 2 and hook.bodies[0] == hook.bodies[1]  # the 503, then the retry
        text = hook.bodies[1]["blocks"][0]["text"]["text"]
        assert "shop-details" in hook.bodies[1]["text"] and "version 1.0" in text and "version 2.0" in text
        assert "to 30.0%" in text and f"{srv.http_url}/ui/monitors/" in text
        rows = sql(srv.db, "SELECT monitor, version, baseline_version, n, baseline_n, p_value, delivered, "
                           "delivery_attempts, len(session_ids) AS shown FROM monitor_firings")
        assert len(rows) == 1
        row = rows[0]
        assert (row["monitor"], row["version"], row["baseline_version"]) == ("shop-details", "2.0", "1.0")
        assert (row["n"], row["baseline_n"], row["delivered"], row["delivery_attempts"]) == (40, 40, True, 2)
        assert row["p_value"] < 1e-4 and row["shown"] == 20  # the 28 that missed details, at most 20 kept
        again = run_cli("monitors", "check", "--db", str(srv.db), "--config", str(config)).stdout
        assert "0 fired" in again and len(hook.bodies) == 2  # the same version pair is not reported twice
        metrics = urllib.request.urlopen(srv.http_url + "/metrics", timeout=10).read().decode()
        assert 'agentfunnel_monitor_firings_total{monitor="shop-details"} 1' in metrics
        assert 'agentfunnel_monitor_firing{monitor="kiosk-details"} 0' in metrics
        assert 'agentfunnel_monitor_sample{monitor="kiosk-details"} 10' in metrics
        assert "agentfunnel_monitor_webhook_retries_total 1" in metrics
        assert 'agentfunnel_monitor_evaluations_total{reason="repeat"} 1' in metrics
        assert 'agentfunnel_monitor_webhook_sends_total{reason="delivered"} 1' in metrics
    finally:
        hook.close()
