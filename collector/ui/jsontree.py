"""JSON values as trees the page can fold: attributes, tool arguments and results, message parts.

Telemetry nests JSON inside JSON strings (tool definitions, arguments, results), so a string that
is itself a JSON object or array is parsed and shown as a tree too. What telemetry sends is
unbounded, so trees are bounded three ways (``UISettings``): a value larger than
``max_json_tree_bytes`` is shown as plain text, levels past ``max_json_tree_depth`` are shown as
compact text, and once a page has spent ``max_json_tree_page_bytes`` on trees the rest of its
values are plain text. Pure functions; the template only walks the nodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..config import UISettings

OPEN_LEVELS = 2  # objects and arrays this shallow start unfolded
SHORT_TEXT = 120  # a leaf string longer than this starts folded behind its first characters


@dataclass
class Node:
    """One value of a tree: a leaf (``children`` None) or an object / array with its entries."""

    key: str | None
    kind: str  # object | array | string | number | bool | null | text (past the depth limit)
    text: str = ""  # a leaf's value as shown; an object's or array's summary
    children: list[Node] | None = None
    from_string: bool = False  # parsed from a JSON string
    open: bool = False


@dataclass
class Block:
    """A whole value as the page shows it: a tree, or plain text when a limit says so (``plain`` names which)."""

    tree: Node | None
    text: str = ""
    plain: str | None = None  # None | "bytes" | "page": why the value is plain text
    size: int = 0


@dataclass
class TreeBudget:
    """The limits of one page; every tree built with it spends from ``max_json_tree_page_bytes``."""

    settings: UISettings = field(default_factory=UISettings)
    spent: int = 0

    def block(self, value: Any) -> Block | None:
        """``value`` (a Python value or JSON text) as a tree, or as plain text past a limit; None when empty."""
        if value is None or value == "":
            return None
        text = value if isinstance(value, str) else _dumps(value)
        size = len(text.encode("utf-8", "replace"))
        if size > self.settings.max_json_tree_bytes:
            return Block(None, _pretty(value), "bytes", size)
        if self.spent + size > self.settings.max_json_tree_page_bytes:
            return Block(None, _pretty(value), "page", size)
        self.spent += size
        parsed = parse_json_text(value) if isinstance(value, str) else value
        if isinstance(value, str) and parsed is None:
            return Block(None, value, None, size)  # text that is not JSON is shown as the text it is
        return Block(_node(None, parsed, 0, self.settings.max_json_tree_depth), "", None, size)


def parse_json_text(value: str) -> Any:
    """The object or array a string holds as JSON text, else None (plain text, a bare number, bad JSON)."""
    s = value.strip()
    if not s or s[0] not in "{[" or s[-1] not in "}]":
        return None
    try:
        parsed = json.loads(s)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, (dict, list)) else None


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, RecursionError):
        return str(value)


def _pretty(value: Any) -> str:
    if isinstance(value, str):
        parsed = parse_json_text(value)
        if parsed is None:
            return value
        value = parsed
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (ValueError, RecursionError):
        return str(value)


def _summary(value: dict | list) -> str:
    if isinstance(value, dict):
        return "{…} " + (f"{len(value)} key" if len(value) == 1 else f"{len(value)} keys")
    return "[…] " + (f"{len(value)} item" if len(value) == 1 else f"{len(value)} items")


def _node(key: str | None, value: Any, depth: int, max_depth: int, from_string: bool = False) -> Node:
    if isinstance(value, str):
        parsed = parse_json_text(value)
        if parsed is not None:
            return _node(key, parsed, depth, max_depth, True)
        return Node(key, "string", value)
    if isinstance(value, (dict, list)):
        if depth >= max_depth:
            return Node(key, "text", _dumps(value), from_string=from_string)
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return Node(key, "object" if isinstance(value, dict) else "array", _summary(value),
                    [_node(str(k), v, depth + 1, max_depth) for k, v in items], from_string, depth < OPEN_LEVELS)
    if isinstance(value, bool):
        return Node(key, "bool", "true" if value else "false")
    if value is None:
        return Node(key, "null", "null")
    if isinstance(value, (int, float)):
        return Node(key, "number", _dumps(value))
    return Node(key, "string", str(value))
