"""llmgw: a control plane that runs LLMs on a fleet of GPU and CPU machines."""

__version__ = "0.11.0.dev0"
