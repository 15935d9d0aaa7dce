"""``python -m otel_llm.agent FD``: the agent process (process.py); started by ``link.AgentLink``."""

import sys

from .process import main

sys.exit(main(sys.argv))
