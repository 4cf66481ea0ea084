"""Fake engines answering the LoRA parts of vLLM's and llama-server's HTTP APIs, as aiohttp
apps for the agent's adapter tests.

Shaped after the engines' own code: vLLM 0.32's ``entrypoints/openai/serving_models.py``
(its answers' texts, status codes and error bodies; ``/v1/models`` listing each adapter with
the base as its ``parent``) and llama.cpp's ``tools/server`` (``GET /lora-adapters``, one
entry per ``--lora`` in start order, by index).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web


@dataclass
class FakeEngine:
    """A fake engine's app and what it was asked: ``loaded`` maps each adapter it holds to
    its path, ``calls`` lists the (route, body) pairs it was sent; ``url`` once served."""

    app: web.Application
    loaded: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, dict]] = field(default_factory=list)
    url: str = ""


def _error(message: str, kind: str, status: int) -> web.Response:
    # vLLM's ErrorResponse: OpenAI's {"error": {...}}.
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


def _authorised(request: web.Request, api_key: str | None) -> bool:
    return not api_key or request.headers.get("Authorization") == f"Bearer {api_key}"


def vllm_app(*, served: str = "base", api_key: str | None = None) -> FakeEngine:
    """vLLM serving ``served`` with LoRA enabled and runtime loading allowed."""
    fake = FakeEngine(web.Application())

    async def load(request: web.Request) -> web.StreamResponse:
        if not _authorised(request, api_key):
            return _error("Unauthorized", "Unauthorized", 401)
        body = await request.json()
        fake.calls.append(("load", body))
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return _error(
                "Both 'lora_name' and 'lora_path' must be provided.", "BadRequestError", 400
            )
        if name in fake.loaded:
            return _error(
                f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput", 400
            )
        if not (Path(path) / "adapter_config.json").is_file():
            return _error(
                f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError", 404
            )
        fake.loaded[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(request: web.Request) -> web.StreamResponse:
        if not _authorised(request, api_key):
            return _error("Unauthorized", "Unauthorized", 401)
        body = await request.json()
        fake.calls.append(("unload", body))
        name = body.get("lora_name")
        if name not in fake.loaded:
            return _error(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404)
        del fake.loaded[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    async def models(request: web.Request) -> web.StreamResponse:
        if not _authorised(request, api_key):
            return _error("Unauthorized", "Unauthorized", 401)
        base = {"id": served, "object": "model", "root": "/weights/base", "parent": None}
        adapters = [
            {"id": name, "object": "model", "root": path, "parent": served}
            for name, path in fake.loaded.items()
        ]
        return web.json_response({"object": "list", "data": [base, *adapters]})

    fake.app.router.add_post("/v1/load_lora_adapter", load)
    fake.app.router.add_post("/v1/unload_lora_adapter", unload)
    fake.app.router.add_get("/v1/models", models)
    return fake


def llama_app(paths: list[str], *, api_key: str | None = None) -> FakeEngine:
    """llama-server started with ``--lora-scaled PATH:0`` for each of ``paths``."""
    fake = FakeEngine(web.Application(), loaded={f"#{i}": p for i, p in enumerate(paths)})

    async def adapters(request: web.Request) -> web.StreamResponse:
        if not _authorised(request, api_key):
            return web.json_response({"error": {"message": "Invalid API Key"}}, status=401)
        return web.json_response(
            [
                {"id": i, "path": path, "scale": 0.0, "task_name": "", "prompt_prefix": ""}
                for i, path in enumerate(paths)
            ]
        )

    fake.app.router.add_get("/lora-adapters", adapters)
    return fake


async def serve(fake: FakeEngine, port: int) -> web.AppRunner:
    """Serve ``fake`` on loopback ``port``; the runner's ``cleanup()`` stops it."""
    runner = web.AppRunner(fake.app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    fake.url = f"http://127.0.0.1:{port}"
    return runner
