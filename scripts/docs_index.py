"""The docs site's home page, docs/index.md, generated from README.md: the same front door, its links
into docs/ made relative to docs/ and its "Read on" list replaced by the site's pages.

    python scripts/docs_index.py            # rewrite docs/index.md
    python scripts/docs_index.py --check    # exit 1 when docs/index.md is stale (a test runs this)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generated_page  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
INDEX = ROOT / "docs" / "index.md"
READ_ON = "## Read on\n"
NOTE = "<!-- generated from README.md by python scripts/docs_index.py; edit the README -->\n"
PAGES = """## The pages

- [Trace contract](trace-contract.md): every span, attribute and event; decode detail and the span
  budget; which requests get spans.
- [Metrics](metrics.md), and [engine-step anatomy, roofline and GPU telemetry](engine-steps.md).
- [Why was it slow?](verdict.md): the slow-cause verdict.
- [Engines](engines.md): vLLM and TensorRT-LLM, and [tested versions](versions.md).
- [The openai client](client.md); [export, providers and its own health](export.md).
- [Collector and scale-out](collector.md), and [its limits](collector-limits.md).
- [Views](views.md): the timeline report, the Grafana dashboard, Jaeger / Tempo / Phoenix.
- [Troubleshooting](troubleshooting.md), [upgrading and changelog](changelog.md).
- [Costs](costs.md), [benchmarks](benchmarks.md), [architecture](architecture.md).
"""


def index(readme: str) -> str:
    """docs/index.md for this README text."""
    if READ_ON not in readme:
        raise ValueError(f"README.md has no {READ_ON.strip()!r} section to replace with the site's pages")
    front = readme[:readme.index(READ_ON)]
    lines = [line for line in front.splitlines(keepends=True) if not line.startswith("Full documentation: ")]
    body = "".join(lines).replace("](docs/", "](")
    title, _, rest = body.partition("\n")
    return f"{title}\n{NOTE}{rest}{PAGES}"


def main(argv: list[str] | None = None) -> int:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return generated_page.main(INDEX, lambda _current: index(readme), __file__, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
