"""The funnel builder: an agent that turns a description of a marketing funnel into a spec the canvas renders.

Its deliverable is the ``spec`` argument of ``create_funnel`` (the shape is in ``funnel_spec``), so
its evaluation cases score it in the three artifact layers. The passing spec of each case is
written out below; each failing behaviour is that spec with one thing wrong, the kind of slip
that reads well and breaks the product: a select field quietly made a text field, a step type
the canvas cannot render, weights that leave traffic unrouted, a rule without a fallback, a step
nothing routes to, copy that forgets the business, or no saved spec at all.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from .funnel_spec import FIELD_TYPES, RENDERABLE_STEP_TYPES, ROUTING_TYPES
from .runtime import Call, Conversation, Failed, Script
from .scripts import ScriptFn
from .tools import ToolError, ToolServer

Spec = dict[str, Any]


class FunnelServer(ToolServer):
    """The canvas host: what it renders, and a draft store for specs (it validates them when they are published)."""

    DEFS = {
        "list_step_types": ("The step, field and routing types the canvas renders.",
                            {"type": "object", "properties": {}}),
        "create_funnel": ("Save a funnel spec as a draft on the canvas.",
                          {"type": "object", "properties": {"spec": {"type": "object"}}, "required": ["spec"]}),
    }

    def list_step_types(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"step_types": list(RENDERABLE_STEP_TYPES), "field_types": list(FIELD_TYPES),
                "routing_types": list(ROUTING_TYPES)}

    def create_funnel(self, args: dict[str, Any]) -> dict[str, Any]:
        spec = args.get("spec")
        if not isinstance(spec, dict) or not isinstance(spec.get("steps"), list):
            raise ToolError("invalid_arguments", "spec must be an object with a list of steps")
        funnel_id = self._id("fnl_")
        return {"funnel_id": funnel_id, "status": "draft", "steps": len(spec["steps"]),
                "canvas_url": f"https://canvas.example/funnels/{funnel_id}"}


def _step(sid: str, kind: str, title: str, routing: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": sid, "type": kind, "title": title, **extra, **({"routing": routing} if routing else {})}


def _next(target: str) -> dict[str, Any]:
    return {"type": "linear", "next": target}


def _field(name: str, label: str, kind: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "label": label, "type": kind, **extra}


# ------------------------------------------------------------------ the passing specs, one per case

def lead_capture() -> Spec:
    return {"name": "B2B SaaS lead capture", "steps": [
        _step("landing", "landing", "Onboard B2B SaaS customers in a day", _next("contact")),
        _step("contact", "form", "Talk to our B2B SaaS team", _next("thanks"), fields=[
            _field("work_email", "Work email", "email", required=True),
            _field("full_name", "Full name", "text", required=True),
            _field("company", "Company", "text", required=True)]),
        _step("thanks", "thank_you", "Thanks, we will reply within one business day"),
    ]}


def dental_booking() -> Spec:
    return {"name": "Dental checkup booking", "steps": [
        _step("landing", "landing", "Dental checkups without the wait", _next("book")),
        _step("book", "booking", "Pick a time for your dental checkup", _next("confirmed"), fields=[
            _field("slot", "Appointment time", "date", required=True),
            _field("phone", "Phone", "phone")]),
        _step("confirmed", "thank_you", "See you at the dental clinic"),
    ]}


def long_qualification() -> Spec:
    sizes = ["1-10", "11-50", "51-200", "200+"]
    return {"name": "Agency qualification", "steps": [
        _step("landing", "landing", "Growth marketing from an agency that ships", _next("contact")),
        _step("contact", "form", "Who should the agency talk to?", _next("company"), fields=[
            _field("full_name", "Full name", "text", required=True),
            _field("work_email", "Work email", "email", required=True)]),
        _step("company", "form", "Your company", _next("budget"), fields=[
            _field("company_size", "Company size", "select", options=sizes, required=True)]),
        _step("budget", "form", "Your budget", _next("process"), fields=[
            _field("monthly_budget", "Monthly budget (USD)", "number")]),
        _step("process", "video", "How the agency works, in two minutes", _next("thanks")),
        _step("thanks", "thank_you", "Thanks: the agency will call you this week"),
    ]}


def webinar_routing() -> Spec:
    return {"name": "Webinar follow-up", "steps": [
        _step("landing", "landing", "The pricing webinar, on demand", _next("role")),
        _step("role", "form", "What is your role?", {
            "type": "conditional", "rules": [{"field": "role", "equals": "Founder", "next": "call"}],
            "fallback": "replay"}, fields=[_field("role", "Role", "select", options=["Founder", "Marketer", "Other"])]),
        _step("call", "booking", "Book a call about the webinar", _next("thanks")),
        _step("replay", "video", "Watch the webinar replay", _next("thanks")),
        _step("thanks", "thank_you", "Thanks for joining the webinar"),
    ]}


def ebook_split() -> Spec:
    return {"name": "Ebook headline test", "steps": [
        _step("ad", "link", "Ebook ad link", {"type": "split", "variants": [
            {"next": "landing_a", "weight": 50}, {"next": "landing_b", "weight": 50}]}),
        _step("landing_a", "landing", "The pricing ebook: ten pages, no fluff", _next("download")),
        _step("landing_b", "landing", "Price like the best SaaS teams: free ebook", _next("download")),
        _step("download", "form", "Get the ebook", _next("thanks"), fields=[_field("email", "Email", "email",
                                                                                   required=True)]),
        _step("thanks", "thank_you", "Your ebook is on its way"),
    ]}


# ------------------------------------------------------------------ one slip each

def _by_id(spec: Spec, sid: str) -> dict[str, Any]:
    return next(s for s in spec["steps"] if s["id"] == sid)


def no_company_field(spec: Spec) -> None:
    contact = _by_id(spec, "contact")
    contact["fields"] = [f for f in contact["fields"] if f["name"] != "company"]


def select_as_text(spec: Spec) -> None:
    """Company size asked as free text: the field is there, with the right label, of the wrong type."""
    field = _by_id(spec, "company")["fields"][0]
    field["type"] = "text"
    field.pop("options", None)


def skips_booking(spec: Spec) -> None:
    """The landing page links straight to the confirmation: nothing routes to the booking step."""
    _by_id(spec, "landing")["routing"] = _next("confirmed")


def generic_copy(spec: Spec) -> None:
    """Copy that could be any business's: the clinic is never mentioned."""
    spec["name"] = "Appointment booking"
    titles = {"landing": "Book your next appointment", "book": "Pick a time", "confirmed": "See you soon"}
    for sid, title in titles.items():
        _by_id(spec, sid)["title"] = title


def no_fallback(spec: Spec) -> None:
    """A rule per role the user named and none for anyone else: the third option leads nowhere."""
    routing = _by_id(spec, "role")["routing"]
    routing["rules"].append({"field": "role", "equals": "Marketer", "next": routing.pop("fallback")})


def weights_to_90(spec: Spec) -> None:
    _by_id(spec, "ad")["routing"]["variants"][1]["weight"] = 40


def invented_step_type(spec: Spec) -> None:
    _by_id(spec, "thanks")["type"] = "download-page"


# ------------------------------------------------------------------ the scripted turns

def _path(spec: Spec) -> str:
    return " → ".join(str(s.get("type")) for s in spec["steps"])


def builds(make: Callable[[], Spec], slip: Callable[[Spec], None] | None = None) -> ScriptFn:
    """Reads what the canvas renders, saves the spec (with ``slip`` applied), reports the draft."""
    def script(c: Conversation) -> Script:
        yield Call("list_step_types", {})
        spec = copy.deepcopy(make())
        if slip is not None:
            slip(spec)
        saved = yield Call("create_funnel", {"spec": spec})
        if isinstance(saved, Failed):
            return f"I could not save the funnel: {saved.message}"
        return (f"Saved draft {saved['funnel_id']} with {len(spec['steps'])} steps ({_path(spec)}): "
                f"{saved['canvas_url']}")
    return script


def describes_only(make: Callable[[], Spec]) -> ScriptFn:
    """Describes the funnel in its answer and ends the conversation without saving a spec."""
    def script(c: Conversation) -> Script:
        yield Call("list_step_types", {})
        spec = make()
        return f"Your funnel is ready: {len(spec['steps'])} steps ({_path(spec)}). Publish it when you like."
    return script
