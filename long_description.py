"""The long description a package index shows, made from a README at build time (both setup.py files).

A package index renders the README away from the repository: a relative link or image would point
nowhere and a mermaid block shows as code. Relative links become links into the repository at ``HOME``
(pinned to the release's tag), images their raw files, and a mermaid block a line pointing to where it is
drawn. Kept in the sdist beside setup.py (MANIFEST.in), so a build from the sdist makes the same text.
"""

from __future__ import annotations

import re
from pathlib import Path

HOME = "https://github.com/otel-llm/otel-llm"  # the repository's home ([project.urls] in both pyproject.toml)

_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
_MERMAID = re.compile(r"```mermaid\n.*?```\n", re.S)


def absolute(text: str, version: str, base: str = "") -> str:
    """``text`` with its relative links made absolute: ``base`` is the README's folder in the repository."""
    ref = f"v{version}"

    def fix(m: re.Match[str]) -> str:
        bang, label, target = m.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#", target):  # https:, mailto:, or an anchor in this page
            return m.group(0)
        path = str(Path(base, target)).replace("\\", "/")
        parts: list[str] = []
        for part in path.split("/"):
            if part == "..":
                parts.pop() if parts else None
            elif part not in ("", "."):
                parts.append(part)
        path = "/".join(parts)
        if bang:
            return f"{bang}[{label}]({HOME}/raw/{ref}/{path})"
        return f"[{label}]({HOME}/blob/{ref}/{path})"

    text = _MERMAID.sub(f"*(A diagram is drawn here on [the repository's page]({HOME}/blob/{ref}/README.md).)*\n",
                        text)
    return _LINK.sub(fix, text)


def long_description(readme: Path, version: str, base: str = "") -> str:
    return absolute(readme.read_text(encoding="utf-8"), version, base)
