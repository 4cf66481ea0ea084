"""The catalog file (LLMGW_CATALOG): declared models and adapters, loaded at start."""

from __future__ import annotations

from pathlib import Path

import yaml

from .domain import AdapterSpec, CatalogError, ModelSpec, parse_adapter, parse_model


def read_catalog_file(path: Path) -> list[ModelSpec]:
    """Parse `models: [...]` from YAML; raise CatalogError with the file's name and the reason."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogError(f"{path} cannot be read: {exc}") from None
    if data is None:
        return []
    if not isinstance(data, dict) or not isinstance(data.get("models", []), list):
        raise CatalogError(f"{path} must hold a mapping with a list under 'models'.")
    try:
        return [parse_model(m, declared=True) for m in data.get("models", [])]
    except CatalogError as exc:
        raise CatalogError(f"{path}: {exc}") from None


def read_catalog_adapters(path: Path) -> list[AdapterSpec]:
    """Parse `adapters: [...]` from the same YAML (each owned by `team:ID` or `project:ID`);
    raise CatalogError with the file's name and the reason."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogError(f"{path} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        return []
    adapters = data.get("adapters") or []
    if not isinstance(adapters, list):
        raise CatalogError(f"{path}: 'adapters' must be a list.")
    try:
        return [parse_adapter(a, declared=True) for a in adapters]
    except CatalogError as exc:
        raise CatalogError(f"{path}: {exc}") from None
