"""LoRA adapters on a running engine: load one, unload one, and read which it holds.

vLLM loads and unloads PEFT adapters while it runs (``POST /v1/load_lora_adapter``, ``POST
/v1/unload_lora_adapter``, which it serves only with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``
set) and lists those it holds in ``GET /v1/models``, each with the base as its ``parent``.
The sim engine answers the same API.

llama-server loads LoRA GGUFs only at its start (``--lora-scaled PATH:0``, engines.py) and
lists them in ``GET /lora-adapters`` by index, the id a request names them by
(``"lora": [{"id": N, "scale": 1.0}]``). It cannot load another file while it runs: loading
an adapter it was not started with fails with a sentence saying so, and the control plane
starts a replica whose start spec names it. Nor can it unload one: an adapter it holds stays
(at scale 0, applied to no request that does not name it) until the replica stops.

Every failure is an ``AdapterError`` whose sentence keeps the engine's own words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import httpx

FORMATS = ("peft", "gguf")
# The catalog's adapter names (fleet/protocol.py AdapterName).
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# The longest detail an adapter_status carries.
DETAIL_CHARS = 2000
# The adapter format each engine takes: vLLM (and the sim, which stands in for it) a PEFT
# folder, llama-server a LoRA GGUF.
ENGINE_FORMATS = {"vllm": "peft", "sim": "peft", "llamacpp": "gguf"}
# Loading reads the adapter's weights from disk into the engine; a large one on a busy CPU
# node takes seconds. Listing is a read of what the engine holds.
LOAD_TIMEOUT_S = 120.0
LIST_TIMEOUT_S = 5.0
# How much of an engine's error body a sentence keeps.
ENGINE_WORDS = 500


class AdapterError(ValueError):
    """An adapter that could not be read, loaded or unloaded; the message is a sentence."""


@dataclass(frozen=True)
class AdapterRef:
    """An adapter as the control plane names it to the agent: its catalog name, its path on
    this node (a PEFT folder or a LoRA GGUF), and which of the two it is."""

    name: str
    path: str
    format: str

    @classmethod
    def from_message(cls, raw: Any) -> AdapterRef:
        """Read an adapter from a command or a start spec; raises AdapterError when it is
        not one."""
        if not isinstance(raw, dict):
            raise AdapterError(f"An adapter is an object with name, path and format, not {raw!r}.")
        name, path, fmt = raw.get("name"), raw.get("path"), raw.get("format")
        if not isinstance(name, str) or not _NAME.match(name):
            raise AdapterError(
                f"The adapter name {name!r} is not 1 to 64 of a-z, 0-9, '.', '_' and '-', "
                "starting with a letter or digit."
            )
        if not isinstance(path, str) or not path:
            raise AdapterError(f"The adapter {name} has no path.")
        if fmt not in FORMATS:
            raise AdapterError(f"The adapter {name}'s format {fmt!r} is not peft or gguf.")
        return cls(name=name, path=path, format=str(fmt))

    def to_message(self) -> dict[str, str]:
        """The adapter as the protocol writes it."""
        return {"name": self.name, "path": self.path, "format": self.format}


@dataclass(frozen=True)
class Held:
    """An adapter an engine holds now: its name, and llama-server's index for it (None on
    vLLM, where requests name it by its name)."""

    name: str
    engine_id: int | None = None

    def to_message(self) -> dict[str, Any]:
        """The entry of ``engine_load``'s ``adapters``."""
        return {"name": self.name, "engine_id": self.engine_id}


def adapter_status(shard_id: str, name: str, state: str, detail: str = "") -> dict[str, Any]:
    """An ``adapter_status`` message: ``state`` is loaded, unloaded or failed, ``detail``
    the sentence of a failure."""
    msg: dict[str, Any] = {"type": "adapter_status", "shard_id": shard_id, "name": name}
    msg["state"] = state
    if detail:
        msg["detail"] = detail[:DETAIL_CHARS]
    return msg


def runtime_loading(engine: str) -> bool:
    """Whether ``engine`` loads and unloads adapters while it runs."""
    return engine != "llamacpp"


def format_refusal(engine: str, ref: AdapterRef) -> str:
    """Why ``engine`` cannot serve ``ref``'s format, or ""."""
    wanted = ENGINE_FORMATS.get(engine)
    if wanted is None:
        return f"The {engine or '(none)'} engine serves no LoRA adapters."
    if ref.format != wanted:
        return (
            f"The adapter {ref.name} is a {ref.format} adapter, and the {engine} engine takes "
            f"{wanted} adapters only."
        )
    return ""


class EngineAdapters:
    """One running engine's adapters, through its HTTP API on this node.

    ``started_with`` is what the engine was started with (the shard's spec): llama-server
    lists its adapters by path, and these give them their names.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        engine: str,
        base_url: str,
        api_key: str | None = None,
        started_with: tuple[AdapterRef, ...] = (),
    ) -> None:
        self.client = client
        self.engine = engine
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.started_with = started_with

    async def load(self, ref: AdapterRef) -> Held:
        """Have the engine hold ``ref``; what it holds it under. Loading one it holds
        already is a success. Raises AdapterError with the engine's words."""
        refusal = format_refusal(self.engine, ref)
        if refusal:
            raise AdapterError(refusal)
        if not runtime_loading(self.engine):
            return await self._started_with(ref)
        body = {"lora_name": ref.name, "lora_path": ref.path}
        r = await self._post("/v1/load_lora_adapter", body, f"load the adapter {ref.name}")
        if r.status_code == 200:
            return Held(ref.name)
        words = engine_words(r)
        # Asked again (the control plane retries a command it heard nothing back from).
        if await self._holds(ref.name):
            return Held(ref.name)
        raise AdapterError(
            f"The engine refused to load the adapter {ref.name} from {ref.path} "
            f"(HTTP {r.status_code}): {words}"
        )

    async def unload(self, name: str) -> None:
        """Have the engine drop the adapter ``name``; one it does not hold is dropped already.
        Raises AdapterError with the engine's words."""
        if not runtime_loading(self.engine):
            if any(h.name == name for h in await self.held()):
                raise AdapterError(
                    f"llama-server cannot unload an adapter while it runs: {name} stays held, "
                    "applied to no request that does not name it, until the replica stops."
                )
            return
        r = await self._post("/v1/unload_lora_adapter", {"lora_name": name}, f"unload {name}")
        if r.status_code == 200:
            return
        words = engine_words(r)
        # vLLM answers 404 for one it does not hold: dropped already, as asked.
        if await self._holds(name) is False:
            return
        raise AdapterError(
            f"The engine refused to unload the adapter {name} (HTTP {r.status_code}): {words}"
        )

    async def held(self) -> list[Held]:
        """The adapters the engine holds now. Raises AdapterError when it cannot be read."""
        if runtime_loading(self.engine):
            body = await self._read("/v1/models")
            models = body.get("data") if isinstance(body, dict) else None
            if not isinstance(models, list):
                raise AdapterError("The engine's /v1/models is not a model list.")
            # vLLM lists the base with no parent and each adapter with the base as its parent.
            return [
                Held(str(m["id"]))
                for m in models
                if isinstance(m, dict) and m.get("parent") and isinstance(m.get("id"), str)
            ]
        body = await self._read("/lora-adapters")
        if not isinstance(body, list):
            raise AdapterError("The engine's /lora-adapters is not a list.")
        names = {ref.path: ref.name for ref in self.started_with}
        held = []
        for entry in body:
            if isinstance(entry, dict) and isinstance(entry.get("id"), int):
                name = names.get(str(entry.get("path")))
                if name is not None:
                    held.append(Held(name, entry["id"]))
        return held

    async def _started_with(self, ref: AdapterRef) -> Held:
        for held in await self.held():
            if held.name == ref.name:
                return held
        raise AdapterError(
            f"llama-server loads adapters only when it starts, and this replica was started "
            f"without {ref.name}: a replica started with it serves it."
        )

    async def _holds(self, name: str) -> bool | None:
        """Whether the engine holds ``name`` now; None when that cannot be read."""
        try:
            return any(h.name == name for h in await self.held())
        except AdapterError:
            return None

    async def _post(self, path: str, body: dict[str, str], what: str) -> httpx.Response:
        try:
            return await self.client.post(
                self.base_url + path, json=body, headers=self.headers, timeout=LOAD_TIMEOUT_S
            )
        except httpx.HTTPError as exc:
            raise AdapterError(
                f"The engine did not answer the request to {what}: {exc or type(exc).__name__}."
            ) from exc

    async def _read(self, path: str) -> Any:
        try:
            r = await self.client.get(
                self.base_url + path, headers=self.headers, timeout=LIST_TIMEOUT_S
            )
        except httpx.HTTPError as exc:
            raise AdapterError(
                f"The engine did not answer {path}: {exc or type(exc).__name__}."
            ) from exc
        if r.status_code != 200:
            raise AdapterError(
                f"The engine answered {path} with HTTP {r.status_code}: {engine_words(r)}"
            )
        try:
            return r.json()
        except ValueError as exc:
            raise AdapterError(f"The engine's {path} is not JSON.") from exc


def engine_words(r: httpx.Response) -> str:
    """What an engine said in an error answer: the message of its JSON error (OpenAI's shape,
    or vLLM's older flat one), else its text, cut to ENGINE_WORDS characters."""
    try:
        body = r.json()
    except ValueError:
        body = None
    message = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            message = error.get("message")
        elif isinstance(error, str):
            message = error
        message = message or body.get("message") or body.get("detail")
    text = str(message) if message else r.text
    text = " ".join(text.split())
    return text[:ENGINE_WORDS] or "(no words)"
