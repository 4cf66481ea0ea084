"""What every ``llmgw ctl`` command shares: the REST API client, the output, and the
types of the arguments.

A command module (``ctl_*.py``) is handlers of ``(api, args, out)`` and a
``register`` that adds them to the parser; it imports this module and
:mod:`llmgw.cli.tables`, never :mod:`llmgw.cli.ctl`, which imports it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, unquote

import httpx

from llmgw import __version__
from llmgw.cli.tables import number

DEFAULT_TIMEOUT_S = 30.0
API_PREFIX = "/api/v1"


class CtlError(Exception):
    """A failure to report as ``error: <message>`` and exit with ``code``, never a traceback."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def error_detail(response: httpx.Response, *, server: str) -> str:
    """The server's sentence for a refusal: ``{"detail": ...}``, else the status line.

    django-ninja answers a body that fails its schema with a list of problems
    under ``detail`` rather than a sentence; those are joined into one line.
    A path the server does not know is answered by Django with an HTML page
    instead: most likely a server older than this command.
    """
    try:
        body = response.json()
    except ValueError:
        path = response.request.url.path
        if response.status_code == 404:
            return f"{server} has no {path} (404); is it an older llmgw?"
        if response.status_code == 405:
            method = response.request.method
            return f"{server} does not take {method} on {path} (405); is it an older llmgw?"
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, str) and detail.strip():
        return detail.strip()
    if isinstance(detail, list) and detail:
        return "; ".join(_problem(item) for item in detail)
    return f"{response.status_code} {response.reason_phrase}".strip()


def _problem(item: Any) -> str:
    """One entry of a validation error list as ``where: what``."""
    if not isinstance(item, dict):
        return str(item)
    where = ".".join(str(part) for part in item.get("loc") or () if part != "body")
    message = str(item.get("msg") or item)
    return f"{where}: {message}" if where else message


class Api:
    """A thin synchronous client for ``/api/v1``: sends the token and actor, raises CtlError."""

    def __init__(
        self,
        *,
        server: str,
        token: str,
        actor: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.server = server
        self.timeout = timeout
        headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "application/json",
            "User-Agent": f"llmgw-ctl/{__version__}",
        }
        if actor:
            headers["X-Llmgw-Actor"] = actor
        try:
            self._client = httpx.Client(
                base_url=server.rstrip("/") + API_PREFIX,
                headers=headers,
                timeout=timeout,
                transport=transport,
            )
        except (httpx.InvalidURL, ValueError) as exc:
            raise CtlError(f"{server} is not a URL llmgw ctl can use: {exc}", 2) from None
        self._models: dict[str, str] = {}

    # A model named in a path (`/models/chat/scale`): found by its name or an alias first.
    MODEL_PATH = re.compile(r"^/models/([^/]+)(/.*)?$")

    def model_name(self, name: str) -> str:
        """The catalog name of the model `name` names, by its name or one of its aliases
        (as the gateway answers to either); `name` itself when no model has it.

        Asked as `GET /models?name=…`, which answers an empty list for no model, so an
        alias never costs a 404 in the server's log; an older server that ignores the
        query sends every model, looked through here the same way."""
        if name not in self._models:
            try:
                found = self._answer(self._send("GET", "/models", {"name": name}, None, None, None))
            except CtlError:  # said by the request that names the model, if it matters
                found = None
            models = [m for m in found if isinstance(m, dict)] if isinstance(found, list) else []
            owners = [m.get("name") for m in models if name in (m.get("aliases") or ())]
            if any(m.get("name") == name for m in models) or len(owners) != 1:
                self._models[name] = name
            else:
                self._models[name] = str(owners[0])
        return self._models[name]

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        files: Mapping[str, Any] | None = None,
        data: Mapping[str, str] | None = None,
    ) -> Any:
        """Send one request and return the decoded JSON answer (None for an empty one);
        with ``files``, a multipart upload of them and the fields in ``data``.

        A model may be named by an alias wherever ctl names one: in a `/models/NAME` path
        (looked up first), and in a `model` filter that found nothing (tried again by the
        name of the model it is an alias of)."""

        def send(path: str, params: Mapping[str, Any] | None) -> httpx.Response:
            return self._send(method, path, params, body, files, data)

        named = self.MODEL_PATH.match(path)
        # POST /models/serve is an action on the catalog, not on a model called "serve".
        if named is not None and (named[2] or method != "POST"):
            called = unquote(named[1])
            name = self.model_name(called)
            if name != called:
                path = f"/models/{segment(name)}{named[2] or ''}"
        answer = self._answer(send(path, params))
        if answer == [] and params and isinstance(params.get("model"), str):
            name = self.model_name(params["model"])
            if name != params["model"]:
                answer = self._answer(send(path, {**params, "model": name}))
        return answer

    def _answer(self, response: httpx.Response) -> Any:
        """The decoded JSON answer (None for an empty one); CtlError for a refusal."""
        if not response.is_success:
            raise CtlError(error_detail(response, server=self.server))
        if not response.content.strip():
            return None
        try:
            return response.json()
        except ValueError:
            raise CtlError(
                f"the answer from {self.server} is not JSON; is --server the llmgw control plane?"
            ) from None

    def _send(self, method, path, params, body, files, data) -> httpx.Response:
        content = None
        headers = {}
        if body is not None:
            # Serialised here, not by httpx, so a YAML date in `model add` becomes
            # a string instead of a TypeError.
            content = json.dumps(body, default=str)
            headers["Content-Type"] = "application/json"
        try:
            response = self._client.request(
                method,
                path,
                params=params,
                content=content,
                headers=headers,
                files=files,
                data=data,
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise CtlError(f"{self.server} is not a URL llmgw ctl can use: {exc}", 2) from None
        except httpx.ConnectTimeout:
            raise CtlError(
                f"cannot reach llmgw at {self.server}: no connection within "
                f"{number(self.timeout)} s"
            ) from None
        except httpx.TimeoutException:
            raise CtlError(
                f"llmgw at {self.server} did not answer within {number(self.timeout)} s"
            ) from None
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise CtlError(f"cannot reach llmgw at {self.server}: {reason}") from None
        return response

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        # An action with nothing to say still sends `{}`, which every handler can parse.
        return self.request("POST", path, body={} if body is None else body)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)


def segment(value: str) -> str:
    """A name or id made safe as one path segment."""
    return quote(value, safe="")


class Output:
    """Where a command's results go: a rendering for people, or the JSON under ``--json``."""

    def __init__(self, *, as_json: bool) -> None:
        self.as_json = as_json

    def show(self, data: Any, rendering: Callable[[Any], str]) -> None:
        """Print the answer: as JSON with ``--json``, else as ``rendering(data)``."""
        if self.as_json:
            if data is not None:
                print(json.dumps(data, indent=2, ensure_ascii=False))
            return
        try:
            text = rendering(data)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise CtlError(
                f"the server's answer is not what this llmgw ctl expects ({exc}); "
                "--json prints it as it came"
            ) from None
        if text:
            print(text)

    def say(self, sentence: str) -> None:
        """A line for people. Under ``--json`` it goes to stderr, so stdout stays one document."""
        print(sentence, file=sys.stderr if self.as_json else sys.stdout)


def said(answer: Any, default: str) -> str:
    """The answer's own sentence (``detail``) when it has one, else ``default``."""
    if isinstance(answer, dict) and isinstance(answer.get("detail"), str) and answer["detail"]:
        return answer["detail"]
    return default


def whole_number(text: str) -> int:
    """argparse type: a whole number, zero or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is below zero")
    return value


def positive_number(text: str) -> float:
    """argparse type: a number above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"{text!r} must be above zero")
    if value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h)?\s*$")


def duration(text: str) -> int:
    """``600``, ``600s``, ``10m`` or ``1h`` as seconds, what the API's idle_timeout takes."""
    match = _DURATION.match(text)
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 600, 90s, 10m or 1h")
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2) or "s"]


# What a command is: it calls the API with the parsed arguments and shows the answer.
Handler = Callable[[Api, argparse.Namespace, Output], None]
