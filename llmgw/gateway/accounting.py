"""What one request used and how it was answered, counted once, after its answer, however
it went: its row in the usage book, what it held of the token limits settled, the
gateway's series on `/metrics` (its status, why it failed, its tokens, its duration) and
its span's figures. `account` is called from one place, the end of `requests._serve`, for
whole and streamed answers, refusals and failures alike; the steps before it only note
what happened: the request's `Outcome`, and on the `Request` the engine's `usage`, the
events passed on and the answer's `verdict`."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from llmgw.core import tracing
from llmgw.gateway import metrics
from llmgw.gateway.state import Request, State

# One line per request, naming it by its id (x-request-id): at INFO for those refused or
# failed (4xx, 5xx, none sent), which a caller quotes; at DEBUG for those answered well.
access = logging.getLogger("llmgw.gateway.access")


@dataclass(slots=True)
class Outcome:
    """How one request was answered, noted by its steps and read once, by `account`."""

    started: float  # time.perf_counter() at its arrival
    rid: str = ""  # its id, told to the caller in x-request-id (answers.request_id)
    model: str = ""  # the catalog name its request series are labelled with; "" for none
    status: int = 0  # the HTTP status it was answered with (499: the caller went); 0: none
    counted: bool = False  # `status` is counted in llmgw_gateway_requests
    failed: str = ""  # why it failed, counted in llmgw_gateway_errors; "" when it did not

    def answered(self, status: int) -> None:
        self.status, self.counted = status, True


def account(rt: State, req: Request | None, out: Outcome, span) -> None:
    """Count one request, once, after its answer (or its end without one)."""
    series = metrics.series(out.model)
    if out.failed:
        series.failed(out.failed)
    if out.counted:
        series.answered(out.status)
    if req is not None:
        if req.verdict:  # the engine's answer failed: under the model that gave it
            metrics.series(req.model).failed(req.verdict)
        # A request let in, whatever became of it, has a row: an error unless its answer
        # passed whole and good.
        tokens = _used(rt, req, error=req.verdict != "")
    took = time.perf_counter() - out.started
    if req is not None:
        _note(rt, req, out, tokens, took)
    series.duration.observe(took)
    _access(req, out, took)
    if span is not None:
        _span_end(span, req, out.status)


def _access(req: Request | None, out: Outcome, took: float) -> None:
    failed = out.status >= 400 or not out.status or (req is not None and req.verdict)
    level = logging.INFO if failed else logging.DEBUG
    if not access.isEnabledFor(level):
        return
    access.log(
        level,
        "request %s key=%s model=%s replica=%s status=%s failed=%s %.0f ms",
        out.rid,
        req.key.prefix if req is not None else "-",
        out.model or "-",
        (req.replica or "-") if req is not None else "-",
        out.status or "-",
        out.failed or (req.verdict if req is not None and req.verdict else "-"),
        took * 1000,
    )


def _note(rt: State, req: Request, out: Outcome, tokens: tuple[int, int], took: float) -> None:
    """Its record, found by its id (tenancy RequestRecord; the fields in the order
    `request_records_add` reads them), for the book's next batch."""
    rt.usage.note(
        (
            out.rid,
            time.time() - took,  # when it arrived
            req.key.id,
            req.key.project_id,
            req.model,
            req.path,
            out.status,
            *tokens,
            round(took * 1000),
            req.replica,
            out.failed or req.verdict or "",
        )
    )


def _used(rt: State, req: Request, *, error: bool) -> tuple[int, int]:
    """Its usage and token counts (`tokens_used`) in the book and the metrics, and what it
    held of the token limits settled; answers its (prompt, completion) tokens."""
    prompt, completion, cached, estimated = tokens_used(req, req.usage)
    rt.usage.record(
        key_id=req.key.id,
        project_id=req.key.project_id,
        model=req.model,
        prompt=prompt,
        completion=completion,
        estimated=estimated,
        request=req.rid,
        error=error,
        latency_ms=(time.perf_counter() - req.started) * 1000,
        now=time.time(),
    )
    if prompt or completion:
        s = metrics.series(req.model)
        s.prompt.inc(prompt)
        s.completion.inc(completion)
        if cached:
            s.cached(cached)
        if estimated:
            s.estimated(estimated)
    if req.held:
        rt.limiter.settle(req.held, prompt + completion, req.admitted)
    return prompt, completion


def tokens_used(req: Request, usage: dict | None) -> tuple[int, int, int, int]:
    """(prompt, completion, cached, estimated) tokens of a request: from the engine's own
    `usage` figures when they came. Otherwise, for a request an engine worked on: a stream
    counts a completion token per event passed on (each carries about one), and one cut
    before its answer (the caller hung up, the server stopped) what it may have written,
    its reservation; either way its prompt by the estimate. `estimated` says how many of
    them no engine counted. A request no engine worked on, or that one refused, used none.
    """
    if isinstance(usage, dict):
        prompt = _tokens(usage.get("prompt_tokens"))
        completion = _tokens(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        cached = 0
        if isinstance(details, dict):  # OpenAI's, vLLM's and llama.cpp's place for it
            cached = min(_tokens(details.get("cached_tokens")), prompt)
        return prompt, completion, cached, 0
    if req.events:
        return req.estimate, req.events, 0, req.estimate
    if req.abandoned:
        written = 0 if req.stream else req.reserved - req.estimate
        return req.estimate, written, 0, req.estimate + written
    return 0, 0, 0, 0


MOST_TOKENS = 100_000_000  # more in one answer is an engine's mistake, not a figure


def _tokens(value: object) -> int:
    """A token count as an engine reported it: a whole number from 0 to MOST_TOKENS, else 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return min(value, MOST_TOKENS)


def _span_end(span, req: Request | None, status: int) -> None:
    """What the request's span says once it is answered: its status, the model that
    served it, and the engine's token counts when they came."""
    usage = req.usage if req is not None and isinstance(req.usage, dict) else {}
    tracing.said(
        span,
        **{
            "http.response.status_code": status or None,
            "llmgw.served_by": req.model if req is not None else None,
            "gen_ai.usage.input_tokens": _count(usage.get("prompt_tokens")),
            "gen_ai.usage.output_tokens": _count(usage.get("completion_tokens")),
        },
    )
    if status >= 500 or not status:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, f"answered {status or 'nothing'}"))


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
