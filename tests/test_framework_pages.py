"""Each page of docs/frameworks runs as written: its set-up, then an agent on an offline model, then its check.

A page marks the blocks a reader copies with an HTML comment just above the fence:
``<!-- test: install -->`` (the pinned install line), ``<!-- test: env -->`` (``export`` lines),
``<!-- test: setup -->`` (the code that switches instrumentation on) and ``<!-- test: run -->`` (the
call that sets the session id), ``<!-- test: check -->`` (an ``agentfunnel sql`` line). The test runs
set-up + a scripted offline agent (tests/fixtures/framework_pages/) + run in a subprocess with only
the page's environment, against a real ``agentfunnel serve``, and reads the session back with the
page's own query.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, ServerProcess, sql

PAGES = ROOT / "docs" / "frameworks"
HARNESS = FIXTURES / "framework_pages"
MARKED = re.compile(r"<!-- test: (\w+) -->\n```[\w-]*\n(.*?)```", re.S)
PAGE_ENDPOINT = "http://127.0.0.1:4318"
ANSWER = "Hotel Baixa, 120 EUR a night."  # every offline model's final answer


def marked_blocks(page: Path) -> dict[str, list[str]]:
    """The page's marked code blocks, by marker, in page order."""
    blocks: dict[str, list[str]] = {}
    for marker, code in MARKED.findall(page.read_text(encoding="utf-8")):
        blocks.setdefault(marker, []).append(code)
    return blocks


def page_env(blocks: dict[str, list[str]], endpoint: str) -> dict[str, str]:
    """The page's ``export K=V`` lines, its endpoint replaced by the test server's."""
    env: dict[str, str] = {}
    for block in blocks.get("env", []):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if not words:
                continue
            assert words[0] == "export" and len(words) == 2 and "=" in words[1], f"not an export line: {line!r}"
            key, value = words[1].split("=", 1)
            env[key] = value.replace(PAGE_ENDPOINT, endpoint)
    return env


def page_pins(blocks: dict[str, list[str]]) -> dict[str, str]:
    """name -> version from the page's install line (``pip install 'a==1'`` or ``npm install a@1``)."""
    pins: dict[str, str] = {}
    for block in blocks["install"]:
        for word in shlex.split(block.replace("\\\n", " "), comments=True):
            if "==" in word:
                name, version = word.split("==", 1)
                pins[name.split("[")[0]] = version
            elif re.fullmatch(r"@?[\w./-]+@\d[\w.-]*", word):
                name, version = word.rsplit("@", 1)
                pins[name] = version
    assert pins, f"no pinned package in {blocks['install']}"
    return pins


def page_query(blocks: dict[str, list[str]]) -> str:
    """The SQL of the page's one-line ``agentfunnel sql "..."`` check."""
    (block,) = blocks["check"]
    words = shlex.split(block.strip())
    assert words[:2] == ["agentfunnel", "sql"] and len(words) == 3, f"not an `agentfunnel sql` line: {block!r}"
    return words[2]


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without any OTEL_* or provider key, plus the page's variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "OPENAI_", "ANTHROPIC_", "AWS_", "OPENINFERENCE_", "LANGSMITH_"))}
    return {**env, **extra}


@dataclass(frozen=True)
class Page:
    name: str  # docs/frameworks/<name>.md
    harness: str  # tests/fixtures/framework_pages/<harness>: the page's model and tool, offline (.py or .mjs)
    session: str  # the session id the page's run block sets
    tool: str
    model: str  # the model name the offline model reports
    skip: str = ""


PAGES_RUN = [
    Page("pydantic-ai", "pydantic_ai_agent.py", "trip-42", "search_hotels", "scripted-model"),
    Page("openai-agents", "openai_agents_agent.py", "trip-43", "search_hotels", "scripted-model"),
    Page("langgraph", "langgraph_agent.py", "trip-44", "search_hotels", "scripted-model"),
    Page("strands", "strands_agent.py", "trip-45", "search_hotels", "scripted-model"),
    Page("opentelemetry-sdk", "", "trip-47", "search_hotels", "scripted-model"),
    Page("vercel-ai", "vercel_ai_agent.mjs", "trip-48", "search_hotels", "scripted-model"),
    Page("crewai", "crewai_agent.py", "trip-46", "search_hotels", "scripted-model"),
]


def assert_session(db: Path, page: Page, blocks: dict[str, list[str]], logs: str) -> None:
    """The page's own check finds the session, with its model, its one tool call and its answer."""
    from agentfunnel.collector.query import query

    rows = sql(db, page_query(blocks))
    assert rows, f"{page.name}: the page's check found no session {page.session!r}\n{logs[-3000:]}"
    (row,) = rows
    assert row["session_id"] == page.session
    assert row["model"] == page.model, row
    assert row["tool_call_count"] == 1 and row["llm_calls"] == 2, row
    assert row.get("agent_name", "hotel_agent") == "hotel_agent", row
    assert row.get("final_answer", ANSWER) == ANSWER, row
    calls = query(db, f"SELECT tool_name, arguments, error FROM tool_calls WHERE session_id = '{page.session}'").rows
    assert [c[0] for c in calls] == [page.tool], calls
    assert json.loads(calls[0][1]) == {"city": "Lisbon", "max_price": 150}, calls
    assert calls[0][2] is None, calls


def check_pins(page: Page, blocks: dict[str, list[str]]) -> None:
    """The page's install line names the versions this test runs (Python: installed; Node: the lock)."""
    pins = page_pins(blocks)
    if page.harness.endswith(".mjs"):
        locked = json.loads((NODE_PACKAGE / "package.json").read_text())["dependencies"]
        assert pins == {k: locked.get(k) for k in pins}, f"{page.name}.md's npm install line is not {NODE_PACKAGE}"
        return
    for name, version in pins.items():
        assert importlib.metadata.version(name) == version, f"{page.name}.md pins {name}=={version}"


@dataclass
class Run:
    """One page's agent script, started in the background (most of its time is spent importing)."""

    page: Page
    blocks: dict[str, list[str]]
    cmd: list[str]
    cwd: Path
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    npm: subprocess.Popen | None = None  # the Node page installs its packages first

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)

    def finish(self, timeout: float = 120) -> str:
        """Wait for the script; its output, asserting it succeeded."""
        if self.npm is not None:
            out, _ = self.npm.communicate(timeout=180)
            assert self.npm.returncode == 0, f"npm ci: {out}"
            self.npm = None
            self.start()
        assert self.proc is not None
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, f"{self.page.name}: {out}"
        return out

    def kill(self) -> None:
        for p in (self.npm, self.proc):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


NODE_PACKAGE = FIXTURES / "recorders" / "vercel-ai"  # package.json + package-lock.json with the page's pins


def prepare(page: Page, srv: ServerProcess, workdir: Path) -> Run:
    """The page's set-up + the offline harness + the page's run block, as one script in ``workdir``."""
    blocks = marked_blocks(PAGES / f"{page.name}.md")
    harness = (HARNESS / page.harness).read_text(encoding="utf-8") if page.harness else ""
    source = "\n".join([*blocks.get("setup", []), harness, *blocks.get("run", [])])
    env = clean_env(page_env(blocks, srv.http_url))
    if not page.harness.endswith(".mjs"):
        (workdir / "agent.py").write_text(source, encoding="utf-8")
        run = Run(page, blocks, [sys.executable, "agent.py"], workdir, env)
        run.start()
        return run
    (workdir / "agent.mjs").write_text(source, encoding="utf-8")
    run = Run(page, blocks, [shutil.which("node") or "node", "agent.mjs"], workdir, env)
    npm = shutil.which("npm")
    if npm and shutil.which("node"):
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(NODE_PACKAGE / name, workdir / name)
        run.npm = subprocess.Popen([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=workdir,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return run


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """One server for every page: each page's session has an id of its own."""
    srv = ServerProcess(tmp_path_factory.mktemp("pages") / "af.duckdb").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def runs(server, tmp_path_factory: pytest.TempPathFactory):
    """Every page's script, started at once; each test then waits for its own."""
    started = {p.name: prepare(p, server, tmp_path_factory.mktemp(p.name)) for p in PAGES_RUN if not p.skip}
    yield started
    for run in started.values():
        run.kill()


@pytest.mark.parametrize("page", PAGES_RUN, ids=lambda p: p.name)
def test_page_runs_as_written(page: Page, server, runs) -> None:
    blocks = marked_blocks(PAGES / f"{page.name}.md")
    assert blocks.get("setup") and blocks.get("run") and blocks.get("check") and blocks.get("install"), sorted(blocks)
    if page.skip:
        pytest.skip(page.skip)
    check_pins(page, blocks)
    run = runs[page.name]
    if page.harness.endswith(".mjs") and not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("the Vercel AI SDK page runs on Node.js: node and npm are not on PATH")
    out = run.finish()
    server.admin_post("/flush")
    assert_session(server.db, page, blocks, out + server.logs())
