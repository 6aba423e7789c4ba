"""Config reference generated from the dataclasses' field docstrings (help text lives in one place)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

from earl_core.config import RunConfig


def field_help(cls: type) -> dict[str, str]:
    """The string literal written under each field of a dataclass."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            out[node.target.id] = " ".join(nxt.value.value.split())
    return out


def config_reference() -> str:
    """Markdown table of every config field: dotted name, default, meaning."""
    lines = ["| field | default | meaning |", "|---|---|---|"]

    def walk(cls: type, instance: object, prefix: str) -> None:
        helps = field_help(cls)
        for f in dataclasses.fields(cls):
            value = getattr(instance, f.name)
            if dataclasses.is_dataclass(value):
                walk(type(value), value, f"{prefix}{f.name}.")
            else:
                lines.append(f"| `{prefix}{f.name}` | `{value!r}` | {helps.get(f.name, '')} |")

    walk(RunConfig, RunConfig(), "")
    return "\n".join(lines)
