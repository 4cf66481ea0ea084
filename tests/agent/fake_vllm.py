"""A package named ``vllm`` that pip can install with nothing from the internet, and a
PEP 503 "simple" index on loopback that serves it.

The wheel is written by hand (a zip with its dist-info and RECORD), so building it needs no
build backend. Its console script ``vllm`` says its version to ``--version`` and answers
``vllm serve MODEL --host H --port P --served-model-name NAME …`` by running llmgw's sim
engine with the Python that runs the tests: the environment the agent makes for it holds
nothing but this package, so it has no llmgw of its own.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import threading
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CLI = '''"""vllm for llmgw's tests: the sim engine behind vLLM's command line."""

import argparse
import os
import sys

PYTHON = {python!r}
VERSION = {version!r}


def main():
    args = sys.argv[1:]
    if args[:1] == ["--version"]:
        print(VERSION)
        return 0
    parser = argparse.ArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("model")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", required=True)
    serve.add_argument("--served-model-name")
    # --tensor-parallel-size, --pipeline-parallel-size and the rest mean nothing here.
    known, _rest = parser.parse_known_args(args)
    env = dict(os.environ)
    if env.get("VLLM_API_KEY"):
        env["LLMGW_ENGINE_API_KEY"] = env["VLLM_API_KEY"]
    name = known.served_model_name or known.model
    argv = [PYTHON, "-m", "llmgw", "sim-engine", "--host", known.host, "--port", known.port]
    os.execve(PYTHON, argv + ["--model", name], env)
'''


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(folder: Path, *, version: str = "0.0.1", python: str = sys.executable) -> Path:
    """Write ``vllm-<version>-py3-none-any.whl`` into ``folder``; returns its path."""
    info = f"vllm-{version}.dist-info"
    files = {
        "vllm/__init__.py": f"__version__ = {version!r}\n",
        "vllm/cli.py": CLI.format(python=python, version=version),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: vLLM's command line over llmgw's sim engine, for tests\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: llmgw-tests\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": "[console_scripts]\nvllm = vllm.cli:main\n",
    }
    record = "".join(
        f"{name},sha256={_digest(body.encode())},{len(body.encode())}\n"
        for name, body in files.items()
    )
    files[f"{info}/RECORD"] = record + f"{info}/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, body in files.items():
            z.writestr(name, body)
    return wheel


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # pip stopped mid-download (a test's time limit): nothing to say.
        pass


class Index:
    """A PEP 503 index of the wheels in ``<root>/files`` on loopback: ``<url>/simple/``.

    ``gets`` counts the requests for each wheel; while ``hold`` is set to an unset event,
    wheels are not served until it is set.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.gets: dict[str, int] = {}
        self.hold: threading.Event | None = None
        self._server: ThreadingHTTPServer | None = None

    def add(self, wheel: Path) -> None:
        """List ``wheel`` (already in ``<root>/files``) under its project."""
        project = wheel.name.split("-", 1)[0]
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        page = self.root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        links = page.read_text() if page.exists() else ""
        links += f'<a href="/files/{wheel.name}#sha256={digest}">{wheel.name}</a><br>\n'
        page.write_text(links)

    def start(self) -> Index:
        index = self

        class Handler(SimpleHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path.startswith("/files/"):
                    name = self.path.rsplit("/", 1)[-1]
                    index.gets[name] = index.gets.get(name, 0) + 1
                    if index.hold is not None:
                        index.hold.wait(timeout=60)
                super().do_GET()

            def log_message(self, *args):
                pass

        self._server = _Server(("127.0.0.1", 0), partial(Handler, directory=str(self.root)))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/simple"

    def stop(self) -> None:
        if self.hold is not None:
            self.hold.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def serve_fake_vllm(root: Path, *, version: str = "0.0.1") -> Index:
    """An index on loopback serving the fake vllm ``version``, started."""
    index = Index(root)
    index.add(build_wheel(root / "files", version=version))
    return index.start()


# pip as the agent runs it in a test: none of this machine's pip configuration (its index,
# its proxies), and no cache shared between tests.
PIP_ENV = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1", "NO_PROXY": "127.0.0.1"}
PIP_ENV_REMOVED = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")


def quiet_pip(monkeypatch) -> None:
    """Set PIP_ENV in this process's environment, which the agent's pip inherits."""
    for name, value in PIP_ENV.items():
        monkeypatch.setenv(name, value)
    for name in PIP_ENV_REMOVED:
        monkeypatch.delenv(name, raising=False)
