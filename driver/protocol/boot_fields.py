"""The boot payload's field names at a path, for a refusal that suggests the field a typo meant.

Only read on the way to exit 78 (msgspec.inspect is imported then, never on a good boot).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

_INDEX = re.compile(r"\[\d+\]")


def fields_at(root: type, path: str) -> list[str]:
    """The field names of the struct at `path` (`""` for the top level, `execution.mcp_servers[0]`);
    empty when `path` does not lead to a struct."""
    import msgspec.inspect as mi

    info: Any = _struct(mi, mi.type_info(root))
    for name in [p for p in _INDEX.sub("", path).split(".") if p]:
        if info is None:
            return []
        field = next((f for f in info.fields if f.encode_name == name), None)
        info = _struct(mi, field.type) if field is not None else None
    return [f.encode_name for f in info.fields] if info is not None else []


def _struct(mi: Any, info: Any) -> Any:
    """The struct inside `info` (itself, a list's items, an optional's non-None member), or None."""
    while True:
        if isinstance(info, mi.StructType):
            return info
        if isinstance(info, mi.ListType):
            info = info.item_type
        elif isinstance(info, mi.UnionType):
            info = next((t for t in info.types if isinstance(t, mi.StructType)), None)
        elif isinstance(info, mi.Metadata):
            info = info.type
        else:
            return None


def suggestion(root: type, path: str, name: str) -> str | None:
    """The field at `path` that `name` most likely meant (`sesion` → `session`), or None."""
    close = difflib.get_close_matches(name, fields_at(root, path), n=1, cutoff=0.6)
    return close[0] if close else None
