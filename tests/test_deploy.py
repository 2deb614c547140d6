"""deploy/: the container image, compose file, Kubernetes manifests and Collector config, checked
statically (no Docker engine or Collector binary here) against the project and the Collector's
own sources, plus one real server started from the deployment's config file."""

from __future__ import annotations

import json
import re
import subprocess
import functools
import textwrap
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from agentfunnel.collector.commands import build_parser
from agentfunnel.collector.config import load_settings
from agentfunnel.collector.receivers.http import HttpReceiver
from agentfunnel.collector.receivers.status import check_bearer
from agentfunnel.collector.telemetry import Metrics
from conftest import ROOT, agentfunnel_cmd
from lake_support import go_seconds

DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
YAML_FILES = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])

# ---------------------------------------------------------------------------- the Collector's schema
# Component types and the config keys each accepts, transcribed from the Collector's sources at
# the version compose.yaml and k8s/otelcol.yaml pin (contrib distribution 0.145.0):
#   opentelemetry-collector v0.145.0: otelcol/config.go, service/config.go,
#     service/pipelines/config.go, receiver/otlpreceiver/config.go, config/configgrpc/configgrpc.go,
#     config/confighttp/server.go, config/confignet/confignet.go, config/configtls/configtls.go,
#     config/configretry/backoff.go, exporter/otlpexporter/config.go,
#     exporter/exporterhelper/internal/queuebatch/config.go, internal/memorylimiter/config.go,
#     config/configoptional/optional.go (`enabled` on optional sections, gate beta since v0.138)
#   opentelemetry-collector-contrib (v0.145 cycle): exporter/loadbalancingexporter/config.go and
#     config.schema.yaml (routing keys: the *RoutingStr constants), extension/healthcheckextension/
#     config.go and metadata.yaml.
# A key missing here fails the test: check the sources before adding one, and when the pinned
# version changes (from contrib 0.153 the exporter is also spelled `load_balancing`).
COLLECTOR_VERSION = "0.145.0"
ANY = None  # a leaf, or a free-form map (headers, auth, middlewares)

TLS_COMMON = {k: ANY for k in (
    "ca_file", "ca_pem", "include_system_ca_certs_pool", "cert_file", "cert_pem", "key_file", "key_pem",
    "min_version", "max_version", "cipher_suites", "reload_interval", "curve_preferences", "tpm")}
TLS_CLIENT = {**TLS_COMMON, "insecure": ANY, "insecure_skip_verify": ANY, "server_name_override": ANY}
TLS_SERVER = {**TLS_COMMON, "client_ca_file": ANY, "client_ca_file_reload": ANY, "enabled": ANY}
NET_ADDR = {"endpoint": ANY, "transport": ANY, "dialer": {"timeout": ANY}}
GRPC_SERVER = {**NET_ADDR, "tls": TLS_SERVER, "max_recv_msg_size_mib": ANY, "max_concurrent_streams": ANY,
               "read_buffer_size": ANY, "write_buffer_size": ANY, "keepalive": ANY, "auth": ANY,
               "include_metadata": ANY, "middlewares": ANY}
HTTP_SERVER = {**NET_ADDR, "tls": TLS_SERVER,
               "cors": {"allowed_origins": ANY, "allowed_headers": ANY, "max_age": ANY, "enabled": ANY},
               "auth": ANY, "max_request_body_size": ANY, "include_metadata": ANY, "response_headers": ANY,
               "compression_algorithms": ANY, "read_timeout": ANY, "read_header_timeout": ANY,
               "write_timeout": ANY, "idle_timeout": ANY, "middlewares": ANY, "keep_alives_enabled": ANY}
GRPC_CLIENT = {"endpoint": ANY, "compression": ANY, "tls": TLS_CLIENT,
               "keepalive": {"time": ANY, "timeout": ANY, "permit_without_stream": ANY, "enabled": ANY},
               "read_buffer_size": ANY, "write_buffer_size": ANY, "wait_for_ready": ANY, "headers": ANY,
               "balancer_name": ANY, "authority": ANY, "auth": ANY, "middlewares": ANY}
QUEUE = {"enabled": ANY, "wait_for_result": ANY, "sizer": ANY, "queue_size": ANY, "block_on_overflow": ANY,
         "storage": ANY, "num_consumers": ANY,
         "batch": {"flush_timeout": ANY, "sizer": ANY, "min_size": ANY, "max_size": ANY, "enabled": ANY}}
RETRY = {k: ANY for k in ("enabled", "initial_interval", "randomization_factor", "multiplier", "max_interval",
                          "max_elapsed_time")}
OTLP_EXPORTER = {"timeout": ANY, "sending_queue": QUEUE, "retry_on_failure": RETRY, **GRPC_CLIENT}
LB_RESOLVERS = {
    "static": {"hostnames": ANY},
    "dns": {"hostname": ANY, "port": ANY, "interval": ANY, "timeout": ANY},
    "k8s": {"service": ANY, "ports": ANY, "timeout": ANY, "return_hostnames": ANY},
    "aws_cloud_map": {"namespace": ANY, "service_name": ANY, "health_status": ANY, "interval": ANY,
                      "timeout": ANY, "port": ANY},
}
LB_ROUTING_KEYS = {"service", "traceID", "metric", "resource", "streamID", "attributes"}
COMPONENTS: dict[str, dict[str, dict[str, Any]]] = {
    "receivers": {"otlp": {"protocols": {"grpc": GRPC_SERVER, "http": {
        **HTTP_SERVER, "traces_url_path": ANY, "metrics_url_path": ANY, "logs_url_path": ANY}}}},
    "processors": {
        "memory_limiter": {k: ANY for k in (
            "check_interval", "min_gc_interval_when_soft_limited", "min_gc_interval_when_hard_limited",
            "limit_mib", "spike_limit_mib", "limit_percentage", "spike_limit_percentage")},
        "batch": {k: ANY for k in ("timeout", "send_batch_size", "send_batch_max_size", "metadata_keys",
                                   "metadata_cardinality_limit")},
    },
    "exporters": {"loadbalancing": {
        "timeout": ANY, "retry_on_failure": RETRY, "sending_queue": QUEUE, "protocol": {"otlp": OTLP_EXPORTER},
        "resolver": LB_RESOLVERS, "routing_key": ANY, "routing_attributes": ANY}},
    "extensions": {"health_check": {**HTTP_SERVER, "path": ANY, "response_body": {"healthy": ANY, "unhealthy": ANY},
                                    "check_collector_pipeline": {"enabled": ANY, "interval": ANY,
                                                                 "exporter_failure_threshold": ANY}}},
    "connectors": {},
}
SERVICE = {"telemetry": ANY, "extensions": ANY, "pipelines": ANY}
PIPELINE_TYPES = {"traces", "metrics", "logs", "profiles"}


def unknown_keys(config: Any, schema: dict[str, Any] | None, path: str) -> list[str]:
    """Dotted paths of keys the schema does not know."""
    if schema is None or not isinstance(config, dict):
        return []
    bad = []
    for key, value in config.items():
        where = f"{path}.{key}"
        if key not in schema:
            bad.append(where)
        else:
            bad.extend(unknown_keys(value, schema[key], where))
    return bad


def collector_problems(cfg: dict[str, Any]) -> list[str]:
    problems = [f"top-level key {k!r}" for k in cfg if k not in {*COMPONENTS, "service"}]
    for kind, known in COMPONENTS.items():
        for cid, ccfg in (cfg.get(kind) or {}).items():
            ctype = cid.split("/", 1)[0]
            if ctype not in known:
                problems.append(f"{kind}: unknown component type {ctype!r}")
                continue
            problems += [f"unknown key {p}" for p in unknown_keys(ccfg or {}, known[ctype], f"{kind}.{cid}")]
    service = cfg.get("service") or {}
    problems += [f"unknown key service.{k}" for k in service if k not in SERVICE]
    for ext in service.get("extensions") or []:
        if ext not in (cfg.get("extensions") or {}):
            problems.append(f"service.extensions names undefined {ext!r}")
    for name, pipeline in (service.get("pipelines") or {}).items():
        if name.split("/", 1)[0] not in PIPELINE_TYPES:
            problems.append(f"pipeline {name!r} has no known signal type")
        problems += [f"pipeline {name}: unknown key {k!r}" for k in pipeline
                     if k not in {"receivers", "processors", "exporters"}]
        for kind in ("receivers", "processors", "exporters"):
            for cid in pipeline.get(kind) or []:
                if cid not in (cfg.get(kind) or {}):
                    problems.append(f"pipeline {name} uses undefined {kind[:-1]} {cid!r}")
    for cid, ecfg in (cfg.get("exporters") or {}).items():
        if cid.split("/", 1)[0] == "loadbalancing":
            problems += loadbalancing_problems(ecfg or {}, cid)
    return problems


def loadbalancing_problems(ecfg: dict[str, Any], cid: str) -> list[str]:
    """The exporter's own rules (config.go Validate, resolver choice, factory)."""
    problems = []
    key = ecfg.get("routing_key", "traceID")
    if key not in LB_ROUTING_KEYS:
        problems.append(f"{cid}: routing_key {key!r} is not one of {sorted(LB_ROUTING_KEYS)}")
    if (key == "attributes") != bool(ecfg.get("routing_attributes")):
        problems.append(f"{cid}: routing_attributes goes with routing_key: attributes, and only with it")
    resolvers = list((ecfg.get("resolver") or {}))
    if len(resolvers) != 1:
        problems.append(f"{cid}: exactly one resolver is required, found {resolvers}")
    if "endpoint" in ((ecfg.get("protocol") or {}).get("otlp") or {}):
        problems.append(f"{cid}: protocol.otlp.endpoint is set by the resolver, not by hand")
    return problems


def commented_block(text: str, start: str, siblings: bool = False) -> dict[str, Any]:
    """A YAML block written as comments (a documented alternative), starting at the line that
    matches ``start``: the following comment lines indented deeper belong to it (and, with
    ``siblings``, keys at the same indentation too)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        body = re.sub(r"^\s*# ?", "", line) if line.lstrip().startswith("#") else None
        if body is not None and re.match(start, body.strip()):
            indent = len(body) - len(body.lstrip())
            block = [body]
            for nxt in lines[i + 1:]:
                if not nxt.lstrip().startswith("#"):
                    break
                inner = re.sub(r"^\s*# ?", "", nxt)
                depth = len(inner) - len(inner.lstrip())
                if not inner.strip() or depth < indent or \
                        (depth == indent and not (siblings and re.match(r"\s*[\w.]+:", inner))):
                    break
                block.append(inner)
            return yaml.safe_load(textwrap.dedent("\n".join(block)))
    raise AssertionError(f"no commented block starting with {start!r}")


# ---------------------------------------------------------------------------- helpers


def load_all(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


@functools.cache
def k8s_docs() -> list[dict[str, Any]]:
    return [d for p in sorted(K8S.glob("*.yaml")) if p.name != "kustomization.yaml" for d in load_all(p)]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def otelcol() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "otelcol.yaml").read_text())


@functools.cache
def settings():
    return load_settings(DEPLOY / "agentfunnel.yaml", environ={})


@functools.cache
def http_routes() -> set[tuple[str, str]]:
    """(method, path) of the OTLP/HTTP port, from the receiver's real route table."""
    recv = HttpReceiver(settings().receivers, pipeline=None, metrics=Metrics(), run_blocking=None)  # type: ignore[arg-type]
    return {(r.method, r.resource.canonical) for r in recv.app.router.routes()}


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instr, _, args = line.partition(" ")
            out.append((instr.upper(), args.strip()))
    return out


def serve_args(argv: list[str]):
    args = build_parser().parse_args(argv)
    assert args.command == "serve"
    return args


# ---------------------------------------------------------------------------- every file


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path: Path) -> None:
    assert load_all(path), f"{path} holds no YAML document"


def test_deploy_files_are_there() -> None:
    for name in ("Dockerfile", "compose.yaml", "otelcol.yaml", "agentfunnel.yaml", "README.md",
                 "k8s/agentfunnel.yaml", "k8s/otelcol.yaml", "k8s/postgres.yaml", "k8s/secret.yaml"):
        assert (DEPLOY / name).is_file(), name


# ---------------------------------------------------------------------------- the Collector config


def test_collector_config_uses_only_real_components_and_keys() -> None:
    assert collector_problems(otelcol()) == []
    shipped = find(k8s_docs(), "ConfigMap", "otelcol-config")["data"]["otelcol.yaml"]
    assert collector_problems(yaml.safe_load(shipped)) == []


def test_the_schema_check_catches_mistakes() -> None:
    cfg = otelcol()
    cfg["exporters"]["loadbalancing"]["routing_key"] = "conversation"
    cfg["exporters"]["loadbalancing"]["protocol"]["otlp"]["tls"]["insecure_skipverify"] = True
    cfg["exporters"]["load_balancer"] = {}
    cfg["service"]["pipelines"]["traces"]["processors"].append("batch")
    problems = "\n".join(collector_problems(cfg))
    assert "routing_key 'conversation'" in problems
    assert "protocol.otlp.tls.insecure_skipverify" in problems
    assert "unknown component type 'load_balancer'" in problems
    assert "undefined processor 'batch'" in problems


def test_collector_routes_by_trace_id_to_the_statefulset_replicas() -> None:
    lb = otelcol()["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID"
    for pipeline in ("traces", "logs"):
        assert otelcol()["service"]["pipelines"][pipeline]["exporters"] == ["loadbalancing"]
    sts = find(k8s_docs(), "StatefulSet", "agentfunnel")
    grpc_port = settings().receivers.grpc_port
    expected = [f"{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}:{grpc_port}"
                for i in range(sts["spec"]["replicas"])]
    assert lb["resolver"]["static"]["hostnames"] == expected


def test_collector_batches_per_replica_and_answers_within_an_sdks_export_timeout() -> None:
    lb = otelcol()["exporters"]["loadbalancing"]
    assert "sending_queue" not in lb  # a queue before the routing would batch across replicas, then split again
    otlp = lb["protocol"]["otlp"]
    queue, retry = otlp["sending_queue"], otlp["retry_on_failure"]
    assert queue["enabled"] and queue["wait_for_result"]  # answered only once the replica committed
    batch = queue["batch"]
    # what the Collector's queuebatch config refuses (exporterhelper/internal/queuebatch/config.go, Validate)
    assert batch.get("sizer") in ("items", "bytes")  # unset, it would take the queue's `requests` sizer
    assert go_seconds(batch["flush_timeout"]) > 0
    max_size = batch.get("max_size", 0)  # 0: no limit
    assert batch["min_size"] >= 0 and (max_size == 0 or max_size >= batch["min_size"])
    # waiting for a batch, then the retries, still answers before an SDK's default 10 s export timeout
    assert go_seconds(batch["flush_timeout"]) + go_seconds(retry["max_elapsed_time"]) < 10


def test_documented_alternatives_are_valid_too() -> None:
    text = (DEPLOY / "otelcol.yaml").read_text()
    by_conversation = commented_block(text, r"routing_key: attributes", siblings=True)
    assert by_conversation == {"routing_key": "attributes", "routing_attributes": ["gen_ai.conversation.id"]}
    assert "without the attribute" in text  # the caveat is written down next to it
    for alternative in (by_conversation,
                        {"resolver": commented_block(text, r"dns:")},
                        {"resolver": commented_block(text, r"k8s:")}):
        cfg = otelcol()
        cfg["exporters"]["loadbalancing"].update(alternative)
        assert collector_problems(cfg) == [], alternative


def test_collector_sends_the_bearer_token_agentfunnel_expects() -> None:
    header = otelcol()["exporters"]["loadbalancing"]["protocol"]["otlp"]["headers"]["authorization"]
    assert "${env:AGENTFUNNEL_BEARER_TOKEN}" in header
    check_bearer(header.replace("${env:AGENTFUNNEL_BEARER_TOKEN}", "s3cret"), "s3cret")  # raises if refused


def test_k8s_configmaps_are_copies_of_the_deploy_files() -> None:
    docs = k8s_docs()
    assert find(docs, "ConfigMap", "otelcol-config")["data"]["otelcol.yaml"] == (DEPLOY / "otelcol.yaml").read_text()
    assert find(docs, "ConfigMap", "agentfunnel-config")["data"]["agentfunnel.yaml"] == \
        (DEPLOY / "agentfunnel.yaml").read_text()


def test_collector_image_is_the_version_the_schema_was_read_from() -> None:
    images = [c["image"] for d in k8s_docs() if d["kind"] == "Deployment"
              for c in d["spec"]["template"]["spec"]["containers"] if "opentelemetry-collector" in c["image"]]
    images.append(yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["otelcol"]["image"])
    assert images and set(images) == {f"otel/opentelemetry-collector-contrib:{COLLECTOR_VERSION}"}


# ---------------------------------------------------------------------------- agentfunnel config and image


def test_agentfunnel_config_is_valid_and_listens_for_the_collector() -> None:
    s = settings()
    assert s.receivers.host == "0.0.0.0"
    assert s.receivers.bearer_token is None  # secrets come from the environment, never the file
    assert {("GET", "/healthz"), ("GET", "/readyz"), ("POST", "/v1/traces"), ("POST", "/v1/logs")} <= http_routes()


def test_dockerfile_builds_from_the_project_files_and_runs_serve() -> None:
    instrs = dockerfile()
    froms = [a for i, a in instrs if i == "FROM"]
    assert froms and all(a.split()[0] == "python:3.11-slim" for a in froms)
    for i, a in instrs:
        if i == "COPY" and not a.startswith("--from"):
            for src in a.split()[:-1]:
                assert (ROOT / src).exists(), f"COPY source {src} is not in the repository"
    copied = {a.split()[0] for i, a in instrs if i == "COPY" and not a.startswith("--from")}
    assert {"pyproject.toml", "collector/", "semconv/", "scoring/"} <= copied
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for src in copied:  # the build context must still contain what is copied
        assert f"!{src}" in ignore, src
    user = [a for i, a in instrs if i == "USER"][-1]
    assert user.split(":")[0] not in ("root", "0")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entrypoint = json.loads([a for i, a in instrs if i == "ENTRYPOINT"][-1])
    cmd = json.loads([a for i, a in instrs if i == "CMD"][-1])
    assert entrypoint == ["agentfunnel"] and "agentfunnel" in scripts
    args = serve_args(cmd)
    assert args.host == "0.0.0.0"
    config_dest = [a.split()[-1] for i, a in instrs if i == "COPY" and a.startswith("deploy/agentfunnel.yaml")]
    assert [str(args.config)] == config_dest
    s = settings()
    exposed = {int(p) for i, a in instrs if i == "EXPOSE" for p in a.split()}
    assert exposed == {s.receivers.grpc_port, s.receivers.http_port}
    health = [a for i, a in instrs if i == "HEALTHCHECK"][-1]
    m = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", health)
    assert m and int(m.group(1)) == s.receivers.http_port and ("GET", m.group(2)) in http_routes()
    assert m.group(2) == "/healthz"


def test_serve_flags_used_by_the_deployment_exist_in_help() -> None:
    out = subprocess.run(agentfunnel_cmd() + ["serve", "--help"], capture_output=True, text=True, check=True).stdout
    flags = set()
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    commands = [json.loads([a for i, a in dockerfile() if i == "CMD"][-1]), compose["x-replica"]["command"]]
    commands += [c["args"] for d in k8s_docs() if d["kind"] == "StatefulSet"
                 for c in d["spec"]["template"]["spec"]["containers"] if "agentfunnel" in c["image"]]
    for command in commands:
        assert command[0] == "serve"
        serve_args(command)
        flags |= {a for a in command if a.startswith("--")}
    assert flags and all(f in out for f in flags), (flags, out)


# ---------------------------------------------------------------------------- compose


def test_compose_topology() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"otelcol", "postgres"} <= set(services)
    otel = services["otelcol"]
    assert "./otelcol.yaml:/etc/otelcol/otelcol.yaml:ro" in otel["volumes"]
    assert (DEPLOY / "otelcol.yaml").is_file()
    assert "--config=/etc/otelcol/otelcol.yaml" in otel["command"]
    assert {"4317:4317", "4318:4318"} <= set(otel["ports"])
    build = compose["x-replica"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == (DEPLOY / "Dockerfile").resolve()
    hostnames = otelcol()["exporters"]["loadbalancing"]["resolver"]["static"]["hostnames"]
    replicas = [n for n in services if n.startswith("agentfunnel-")]
    aliases = [a for n in replicas for a in services[n]["networks"]["default"]["aliases"]]
    assert sorted(f"{a}:{settings().receivers.grpc_port}" for a in aliases) == sorted(hostnames)
    assert set(otel["depends_on"]) == set(replicas)
    declared = set(compose["volumes"])
    for name in replicas + ["postgres"]:
        svc = services[name]
        for vol in svc["volumes"]:
            assert vol.split(":")[0] in declared
    lake_mounts = {v for n in replicas for v in services[n]["volumes"] if v.startswith("lakedata:")}
    assert len(lake_mounts) == 1, "every replica mounts the same Parquet volume at the same path"
    assert services["agentfunnel-0"]["environment"]["AGENTFUNNEL_BEARER_TOKEN"].startswith("${AGENTFUNNEL_BEARER_TOKEN")
    assert services["postgres"]["healthcheck"]["test"]
    assert services["agentfunnel-0"]["depends_on"]["postgres"]["condition"] == "service_healthy"


# ---------------------------------------------------------------------------- Kubernetes


def test_k8s_documents_have_the_required_fields() -> None:
    docs = k8s_docs()
    assert docs
    for d in docs:
        assert d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"), d
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"}


def workloads(docs):
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def test_k8s_workloads_are_wired() -> None:
    docs = k8s_docs()
    secrets = {d["metadata"]["name"]: {**d.get("stringData", {}), **d.get("data", {})}
               for d in docs if d["kind"] == "Secret"}
    configmaps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    pvcs = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    for w in workloads(docs):
        spec = w["spec"]
        labels = spec["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items(), w["metadata"]["name"]
        pod = spec["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
        for c in pod["containers"]:
            assert c.get("ports"), f"{c['name']} declares no container port"
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets.get(ref["name"], {}), ref
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes or m["name"] in claims, m
        for v in volumes.values():
            if "configMap" in v:
                assert v["configMap"]["name"] in configmaps
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in pvcs
        if w["kind"] == "StatefulSet":
            svc = find(docs, "Service", spec["serviceName"])
            assert svc["spec"].get("clusterIP") == "None", "a StatefulSet's serviceName must be headless"
    for svc in (d for d in docs if d["kind"] == "Service"):
        selected = [w for w in workloads(docs)
                    if svc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(selected) == 1, svc["metadata"]["name"]
        port_names = {p["name"] for c in selected[0]["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in port_names or isinstance(p["targetPort"], int)


def test_k8s_agentfunnel_probes_point_at_real_endpoints() -> None:
    docs = k8s_docs()
    sts = find(docs, "StatefulSet", "agentfunnel")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    s = settings()
    assert set(ports.values()) == {s.receivers.grpc_port, s.receivers.http_port}
    routes = http_routes()
    paths = {}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert ports[get["port"]] == s.receivers.http_port
        assert ("GET", get["path"]) in routes
        paths[probe] = get["path"]
    assert paths["livenessProbe"] == "/healthz" and paths["readinessProbe"] == "/readyz"
    assert sts["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    headless = find(docs, "Service", "agentfunnel")
    assert {p["port"] for p in headless["spec"]["ports"]} == {s.receivers.grpc_port, s.receivers.http_port}
    otel = find(docs, "Deployment", "otelcol")
    (oc,) = otel["spec"]["template"]["spec"]["containers"]
    health = otelcol()["extensions"]["health_check"]["endpoint"]
    oports = {p["name"]: p["containerPort"] for p in oc["ports"]}
    assert oports[oc["livenessProbe"]["httpGet"]["port"]] == int(health.rsplit(":", 1)[1])
    assert find(docs, "StatefulSet", "postgres")


# ---------------------------------------------------------------------------- the real server


def test_the_deployment_config_boots_a_server_that_takes_the_collectors_requests(server_factory, tmp_path) -> None:
    """`agentfunnel serve` with deploy/agentfunnel.yaml (loopback and free ports for the test):
    the probes answer, and an OTLP/gRPC export carrying the Collector's header is accepted."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    srv = server_factory(args=["--config", str(DEPLOY / "agentfunnel.yaml"), "--host", "127.0.0.1"],
                         db=tmp_path / "deploy.duckdb", env={"AGENTFUNNEL_BEARER_TOKEN": "s3cret"})
    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(srv.http_url + path, timeout=5) as resp:
            assert resp.status == 200
    header = otelcol()["exporters"]["loadbalancing"]["protocol"]["otlp"]["headers"]["authorization"]
    header = header.replace("${env:AGENTFUNNEL_BEARER_TOKEN}", "s3cret")
    with grpc.insecure_channel(srv.grpc) as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        stub.Export(trace_service_pb2.ExportTraceServiceRequest(), metadata=[("authorization", header)], timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Export(trace_service_pb2.ExportTraceServiceRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


# ---------------------------------------------------------------------------- shared storage wiring


def _lake_of(env: dict[str, str]):
    """The lake settings a replica gets from its environment and the shipped config file."""
    plain = {k: v for k, v in env.items() if not v.startswith("${")}
    lake = load_settings(DEPLOY / "agentfunnel.yaml", environ=plain).store.lake
    assert lake is not None, "the replica is not configured for the shared DuckLake"
    return lake


def test_compose_replicas_share_one_lake_with_distinct_indices() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    replicas = sorted(n for n in services if n.startswith("agentfunnel-"))
    lakes = [_lake_of(services[n]["environment"]) for n in replicas]
    assert sorted(lake.replica for lake in lakes) == list(range(len(replicas)))
    assert {lake.replicas for lake in lakes} == {len(replicas)}
    assert len({(lake.catalog, lake.data_path) for lake in lakes}) == 1
    host = dict(part.split("=", 1) for part in lakes[0].catalog.removeprefix("postgres:").split())
    assert host["host"] == "postgres" and host["dbname"] == services["postgres"]["environment"]["POSTGRES_DB"]
    mount = next(v for v in services[replicas[0]]["volumes"] if v.startswith("lakedata:")).split(":")[1]
    assert lakes[0].data_path.rstrip("/") == mount.rstrip("/")
    assert compose["x-replica"]["build"]["args"]["EXTRAS"] == "[lake]"
    assert "PGPASSWORD" in services[replicas[0]]["environment"]


def test_k8s_replicas_share_one_lake_and_take_their_index_from_the_pod_name() -> None:
    docs = k8s_docs()
    sts = find(docs, "StatefulSet", "agentfunnel")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["AGENTFUNNEL_LAKE_REPLICA"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "agentfunnel-secrets"
    plain = {k: e["value"] for k, e in env.items() if "value" in e}
    for ordinal in range(sts["spec"]["replicas"]):  # what each pod's name gives
        lake = _lake_of({**plain, "AGENTFUNNEL_LAKE_REPLICA": f"{sts['metadata']['name']}-{ordinal}"})
        assert lake.replica == ordinal and lake.replicas == sts["spec"]["replicas"]
    service = find(docs, "Service", "postgres")
    assert f"host={service['metadata']['name']}" in plain["AGENTFUNNEL_LAKE_CATALOG"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert plain["AGENTFUNNEL_LAKE_DATA_PATH"].rstrip("/") in mounts
