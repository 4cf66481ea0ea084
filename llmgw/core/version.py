"""The llmgw release this process runs, as pip installed it: what an agent reports in
`register` and what `llmgw ctl upgrade` compares nodes with."""

from importlib import metadata


def installed() -> str:
    """The installed distribution's version; a source tree never installed says so."""
    try:
        return metadata.version("llmgw")
    except metadata.PackageNotFoundError:
        return "0.0.0+unknown"
