"""The long description a package index shows: README.md with nothing that points into the checkout."""

from __future__ import annotations

import importlib.util
import re

from support.distributions import ROOT

from otel_llm.version import __version__

# beside setup.py, not in a package: loaded from its file
_spec = importlib.util.spec_from_file_location("long_description", ROOT / "long_description.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
HOME, absolute, long_description = _module.HOME, _module.absolute, _module.long_description


def test_the_readme_on_an_index_page_has_only_absolute_links_and_no_mermaid():
    text = long_description(ROOT / "README.md", __version__)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert targets, "the README has links"
    relative = [t for t in targets if not re.match(r"^(https?:|mailto:|#)", t)]
    assert relative == []
    assert "```mermaid" not in text
    assert f"{HOME}/raw/v{__version__}/docs/report-timeline.png" in text  # the image, as a raw file


def test_links_resolve_against_the_readmes_folder():
    text = absolute("[a](../docs/x.md#y) ![i](img.png) [ext](https://e.org) [here](#top)", "1.2.3", "collector")
    assert text == (f"[a]({HOME}/blob/v1.2.3/docs/x.md#y) ![i]({HOME}/raw/v1.2.3/collector/img.png) "
                    "[ext](https://e.org) [here](#top)")
