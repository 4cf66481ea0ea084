"""The node agent: ``llmgw agent``.

It runs on every node of the fleet, registers the machine with the control
plane over a websocket, sends heartbeats, and starts and stops the engine
processes the control plane asks for. It is plain Python with no Django
import, since nodes have neither the control plane's database nor its
settings.
"""

from importlib import metadata


def _version() -> str:
    # The agent ships inside the llmgw distribution; a source checkout that
    # was never installed has no metadata, and says so rather than guessing.
    try:
        return metadata.version("llmgw")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"


AGENT_VERSION = _version()
