"""Test-only: on PYTHONPATH, removes the vLLM symbols named in OTEL_LLM_TEST_REMOVE ("module:Class.attr,...")
in every process that imports their modules (the frontend and the EngineCore vLLM spawns, which inherits
the environment), as a vLLM release without them would be. Each removal is noted in OTEL_LLM_TEST_MARKS
(a folder: one file per process and symbol) so the test knows it happened where it matters."""

import multiprocessing
import os

_SPEC = os.environ.get("OTEL_LLM_TEST_REMOVE", "")


def _remover(qualname: str):
    def remove(module) -> None:
        owner_name, attr = qualname.rsplit(".", 1)
        owner = module
        for part in owner_name.split("."):
            owner = getattr(owner, part)
        if attr in vars(owner):
            delattr(owner, attr)
        marks = os.environ.get("OTEL_LLM_TEST_MARKS")
        if marks:
            name = f"{multiprocessing.current_process().name}-{os.getpid()}-{qualname}"
            open(os.path.join(marks, name), "w").close()
    return remove


if _SPEC:
    import wrapt

    for item in _SPEC.split(","):
        module_name, qualname = item.split(":")
        wrapt.register_post_import_hook(_remover(qualname), module_name)
