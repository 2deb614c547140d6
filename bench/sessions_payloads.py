"""Agent sessions as OTLP requests, the way agent processes would export them (``ingest.py --sessions``).

Each session is a conversation of ``turns`` turns; each turn is its own trace, an ``invoke_agent``
span (GenAI semantic conventions, ``gen_ai.conversation.id`` = the session id) over four
``chat`` spans and four ``execute_tool`` spans of a shopping funnel (search_products,
get_product_details, add_to_cart, checkout), with JSON arguments and results of a few hundred
bytes (product ids, a cart id, an order confirmation on checkout).

Sessions are split over ``clients`` agent processes (one resource, ``service.instance.id``, each),
and each process works ``active`` sessions at once. Its spans leave in the order they end (a
turn's chat and tool spans one after the other, the ``invoke_agent`` span last), interleaved across
the turns in progress and cut into requests of up to ``spans_per_request`` spans, as a
BatchSpanProcessor does: a request mixes many traces and a turn usually straddles two or three
requests. A session's next turn starts only in the request after the one that carried the end of
its previous turn, so when a client sends its requests in order, turn n+1 is sent after every
request of turn n. A request is cut short when no turn in progress may add to it (the SDK's timer
flush of a quiet process), which only happens with few active sessions.
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from payloads import _kv

SPANS_PER_TURN = 9
AGENT = "shop-agent"
MODELS = [("anthropic", "claude-sonnet-4", "claude-sonnet-4-20250514"),
          ("openai", "gpt-4.1", "gpt-4.1-2025-04-14")]
QUERIES = ["trail running shoes", "waterproof hiking jacket", "merino wool socks", "ultralight tent 2 person",
           "insulated water bottle", "running shorts with pockets", "headlamp rechargeable", "down sleeping bag"]
CATEGORIES = ["footwear", "outerwear", "accessories", "camping", "apparel"]
COLORS = ["black", "slate", "forest", "ember", "sand"]
SIZES = ["40", "41", "42", "43", "44", "M", "L"]
# The tools of each turn: every turn but the last browses and fills the cart; the last one ends
# the session its way (most buy, some leave a full cart, some only browse).
MIDDLE_TURN = ["search_products", "get_product_details", "get_product_details", "add_to_cart"]
FINAL_TURNS = [(0.60, ["search_products", "get_product_details", "add_to_cart", "checkout"]),
               (0.25, ["search_products", "get_product_details", "get_product_details", "add_to_cart"]),
               (0.15, ["search_products", "search_products", "get_product_details", "get_product_details"])]


def session_id(prefix: str, n: int) -> str:
    return f"{prefix}-{n:06d}"


@dataclass
class _Session:
    sid: str
    turns: int
    plans: list[list[str]]
    rnd: random.Random
    user: str
    start_ns: int
    turn: int = 0
    queue: deque = field(default_factory=deque)   # this turn's spans not yet exported, in end order
    ready_at: int = 0                              # first request index this turn may go into
    cart_id: str = ""
    products: list[str] = field(default_factory=list)


def _tool_call(s: _Session, tool: str) -> tuple[dict, dict]:
    """Arguments and result of one call, consistent within the session (ids found, cart kept)."""
    r = s.rnd
    if tool == "search_products":
        query = r.choice(QUERIES)
        found = [f"prod_{r.randrange(16**8):08x}" for _ in range(4)]
        s.products = found
        args = {"query": query, "filters": {"category": r.choice(CATEGORIES), "max_price": r.choice([80, 150, 300]),
                                            "in_stock": True}, "limit": 4, "sort": "relevance", "locale": "en-US"}
        result = {"products": [{"id": p, "title": f"{query.title()} {i + 1}", "price": {
            "amount": round(r.uniform(19, 299), 2), "currency": "USD"}, "rating": round(r.uniform(3.5, 5), 1)}
            for i, p in enumerate(found)], "total": r.randrange(5, 120)}
    elif tool == "get_product_details":
        pid = r.choice(s.products) if s.products else f"prod_{r.randrange(16**8):08x}"
        args = {"product_id": pid, "include": ["variants", "availability", "shipping"]}
        result = {"id": pid, "title": f"{r.choice(QUERIES).title()}", "brand": "Northridge",
                  "variants": [{"id": f"var_{r.randrange(16**8):08x}", "size": sz, "color": r.choice(COLORS),
                                "price": round(r.uniform(19, 299), 2), "available": r.random() > 0.2}
                               for sz in r.sample(SIZES, 3)],
                  "shipping": {"days": r.randrange(1, 6), "free_over": 100}}
    elif tool == "add_to_cart":
        if not s.cart_id:
            s.cart_id = f"cart_{r.randrange(16**10):010x}"
        vid = f"var_{r.randrange(16**8):08x}"
        qty = r.choice([1, 1, 1, 2])
        args = {"cart_id": s.cart_id, "variant_id": vid, "quantity": qty}
        price = round(r.uniform(19, 299), 2)
        result = {"cart_id": s.cart_id, "line_items": [{"variant_id": vid, "quantity": qty, "unit_price": price}],
                  "subtotal": {"amount": round(price * qty, 2), "currency": "USD"}, "item_count": qty}
    else:  # checkout
        if not s.cart_id:
            s.cart_id = f"cart_{r.randrange(16**10):010x}"
        args = {"cart_id": s.cart_id, "payment_method_id": f"pm_{r.randrange(16**12):012x}",
                "shipping_address_id": f"addr_{r.randrange(16**8):08x}", "shipping_speed": "standard"}
        result = {"status": "confirmed", "order_id": f"ord_{r.randrange(16**10):010x}", "cart_id": s.cart_id,
                  "total": {"amount": round(r.uniform(40, 600), 2), "currency": "USD"},
                  "estimated_delivery": "2025-06-12", "email_sent": True}
    return args, result


def _turn_spans(s: _Session) -> deque:
    """The spans of the session's current turn, as protobuf Spans in the order they end."""
    r = s.rnd
    trace_id = r.randbytes(16)
    root = r.randbytes(8)
    provider, model, response_model = MODELS[r.random() < 0.3]
    t = s.start_ns
    out: deque = deque()
    for tool in s.plans[s.turn]:
        chat_start, chat_end = t, t + r.randrange(600, 3000) * 1_000_000
        out.append(Span(trace_id=trace_id, span_id=r.randbytes(8), parent_span_id=root, name=f"chat {model}",
                        kind=Span.SPAN_KIND_CLIENT, start_time_unix_nano=chat_start, end_time_unix_nano=chat_end,
                        attributes=[
                            _kv("gen_ai.operation.name", "chat"), _kv("gen_ai.provider.name", provider),
                            _kv("gen_ai.request.model", model), _kv("gen_ai.response.model", response_model),
                            _kv("gen_ai.usage.input_tokens", r.randrange(800, 6000)),
                            _kv("gen_ai.usage.output_tokens", r.randrange(30, 400)),
                            _kv("gen_ai.response.finish_reasons", ["tool_calls"]),
                            _kv("gen_ai.response.id", f"msg_{r.randrange(16**12):012x}")]))
        args, result = _tool_call(s, tool)
        tool_start, tool_end = chat_end, chat_end + r.randrange(80, 900) * 1_000_000
        out.append(Span(trace_id=trace_id, span_id=r.randbytes(8), parent_span_id=root, name=f"execute_tool {tool}",
                        kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=tool_start, end_time_unix_nano=tool_end,
                        attributes=[
                            _kv("gen_ai.operation.name", "execute_tool"), _kv("gen_ai.tool.name", tool),
                            _kv("gen_ai.tool.type", "function"),
                            _kv("gen_ai.tool.call.id", f"toolu_{r.randrange(16**12):012x}"),
                            _kv("gen_ai.tool.call.arguments", json.dumps(args)),
                            _kv("gen_ai.tool.call.result", json.dumps(result))]))
        t = tool_end
    end = t + r.randrange(200, 1500) * 1_000_000  # the final answer
    out.append(Span(trace_id=trace_id, span_id=root, name=f"invoke_agent {AGENT}", kind=Span.SPAN_KIND_INTERNAL,
                    start_time_unix_nano=s.start_ns, end_time_unix_nano=end, attributes=[
                        _kv("gen_ai.operation.name", "invoke_agent"), _kv("gen_ai.agent.name", AGENT),
                        _kv("gen_ai.conversation.id", s.sid), _kv("gen_ai.provider.name", provider),
                        _kv("gen_ai.request.model", model), _kv("enduser.id", s.user)]))
    s.start_ns = end + r.randrange(5, 90) * 1_000_000_000  # the user's think time before the next turn
    return out


def _plans(rnd: random.Random, turns: int) -> list[list[str]]:
    x, acc = rnd.random(), 0.0
    final = FINAL_TURNS[-1][1]
    for p, tools in FINAL_TURNS:
        acc += p
        if x < acc:
            final = tools
            break
    return [MIDDLE_TURN] * (turns - 1) + [final]


@dataclass
class Streams:
    """Per client, its requests in the order it sends them; and what they hold."""

    bodies: list[list[bytes]]
    session_ids: list[str]
    spans: int
    traces_per_request: float
    requests_per_trace: float
    spans_per_request: float

    @property
    def requests(self) -> int:
        return sum(len(b) for b in self.bodies)


def session_streams(session_count: int, turns: int, clients: int, spans_per_request: int = 512,
                    active: int = 128, seed: int = 0, prefix: str = "bench") -> Streams:
    """``session_count`` sessions of ``turns`` turns, as ``clients`` ordered streams of request bytes."""
    rnd = random.Random(seed)
    now = time.time_ns()
    ids = [session_id(prefix, n) for n in range(session_count)]
    bodies: list[list[bytes]] = []
    spans = traces_in_requests = 0
    trace_requests: dict[bytes, int] = {}
    for k in range(clients):
        pending = deque()
        for n in range(k, session_count, clients):
            r = random.Random(rnd.randrange(2**63))
            pending.append(_Session(ids[n], turns, _plans(r, turns), r, f"user_{r.randrange(10**6):06d}",
                                    now - r.randrange(3600, 7200) * 1_000_000_000))
        slots: list[_Session] = []
        stream: list[bytes] = []
        index = 0

        def start(s: _Session, at: int) -> None:
            s.queue = _turn_spans(s)
            s.ready_at = at
            slots.append(s)  # noqa: B023 -- start is called within the iteration that defines it

        while pending or slots:
            while len(slots) < active and pending:
                start(pending.popleft(), index)
            emitting = [s for s in slots if s.ready_at <= index]
            req = ExportTraceServiceRequest()
            rs = req.resource_spans.add()
            rs.resource.attributes.extend([
                _kv("service.name", AGENT), _kv("service.version", "1.4.2"),
                _kv("service.instance.id", f"{AGENT}-{k}"), _kv("deployment.environment.name", "bench"),
                _kv("telemetry.sdk.name", "opentelemetry"), _kv("telemetry.sdk.language", "python"),
                _kv("telemetry.sdk.version", "1.33.0")])
            ss = rs.scope_spans.add()
            ss.scope.name = "opentelemetry.instrumentation.genai"
            ss.scope.version = "0.3b0"
            out: list[Span] = []
            while len(out) < spans_per_request and emitting:
                i = rnd.randrange(len(emitting))
                s = emitting[i]
                out.append(s.queue.popleft())
                if s.queue:
                    continue
                emitting[i] = emitting[-1]
                emitting.pop()
                s.turn += 1
                if s.turn < s.turns:
                    s.queue = _turn_spans(s)
                    s.ready_at = index + 1      # the next turn goes out after this one's requests
                else:
                    slots.remove(s)
                    if pending:                 # a new conversation takes the slot at once
                        start(pending.popleft(), index)
                        emitting.append(slots[-1])
            if not out:
                index += 1                      # nothing may go into this request: wait for the next
                continue
            ss.spans.extend(out)
            seen = {sp.trace_id for sp in out}
            for t in seen:
                trace_requests[t] = trace_requests.get(t, 0) + 1
            traces_in_requests += len(seen)
            spans += len(out)
            stream.append(req.SerializeToString())
            index += 1
        bodies.append(stream)
    n_requests = sum(len(b) for b in bodies)
    return Streams(bodies, ids, spans, traces_in_requests / max(1, n_requests),
                   sum(trace_requests.values()) / max(1, len(trace_requests)), spans / max(1, n_requests))


if __name__ == "__main__":
    t0 = time.perf_counter()
    st = session_streams(3360, 2, 4)
    print(f"{st.spans} spans in {st.requests} requests ({st.spans_per_request:.0f} spans, "
          f"{st.traces_per_request:.0f} traces each; a trace over {st.requests_per_trace:.2f} requests), "
          f"{sum(len(b) for s in st.bodies for b in s) / 1e6:.1f} MB, built in {time.perf_counter() - t0:.1f}s")
