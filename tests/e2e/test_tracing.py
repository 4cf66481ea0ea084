"""A real `llmgw serve` (and, in production, its Celery worker) sending spans over OTLP/HTTP
to a receiver on loopback, decoded as a collector would (issue 14, item 1)."""

from __future__ import annotations

import http.server
import threading

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .conftest import MODES
from .harness import SMALL, Cluster, free_port, gateway_key, gateway_project, wait_for


class Receiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf; keeps every span by name."""

    def __init__(self) -> None:
        self.spans: dict[str, list] = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the standard library's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest.FromString(body)
                    with outer.lock:
                        for resource in request.resource_spans:
                            service = {
                                a.key: a.value.string_value for a in resource.resource.attributes
                            }.get("service.name")
                            for scope in resource.scope_spans:
                                for span in scope.spans:
                                    outer.spans.setdefault(span.name, []).append((service, span))
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", free_port()), Handler)

    def named(self, name: str) -> list:
        with self.lock:
            return list(self.spans.get(name, ()))


def _attributes(span) -> dict:
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = v.string_value or v.int_value or v.bool_value or v.double_value
    return out


@pytest.mark.parametrize("mode", MODES)
def test_a_served_request_and_a_pass_reach_an_otlp_receiver_on_loopback(tmp_path, mode):
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    cluster = Cluster(tmp_path, production=mode == "production")
    cluster.env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{receiver.server_address[1]}",
        OTEL_BSP_SCHEDULE_DELAY="200",
        OTEL_SERVICE_NAME="llmgw-e2e",
    )
    try:
        cluster.start_server()
        cluster.start_agent("cpu-a", "--memory-gb", "8", "--cpus", "4", port_range="32200-32299")
        wait_for("the node", lambda: cluster.client.get("/nodes/cpu-a").status_code == 200)
        cluster.post("/models", SMALL)
        wait_for("a ready replica", lambda: cluster.ready_replicas("small") or None, timeout=60)
        key = gateway_key(cluster, gateway_project(cluster, "acme"), "k")
        answer = httpx.post(
            f"{cluster.url}/v1/chat/completions",
            json={"model": "small", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {key['secret']}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text

        def served() -> list:
            return [
                (service, s)
                for service, s in receiver.named("POST /v1/chat/completions")
                if _attributes(s).get("http.response.status_code") == 200
            ]

        [(service, request)] = wait_for("the request's span", served, timeout=30)
        assert service == "llmgw-e2e"
        a = _attributes(request)
        assert (a["llmgw.model"], a["llmgw.project"]) == ("small", "project:acme/team/project")
        assert a["gen_ai.usage.output_tokens"] > 0
        upstream = wait_for(
            "the upstream attempt's span",
            lambda: [
                s for _, s in receiver.named("llmgw.upstream") if s.trace_id == request.trace_id
            ],
        )
        assert upstream[0].parent_span_id == request.span_id
        passes = wait_for(
            "a reconciler pass with a decision",
            lambda: [
                s
                for _, s in receiver.named("llmgw.reconciler.pass")
                if any("placed on cpu-a" in e.attributes[0].value.string_value for e in s.events)
            ],
            timeout=30,
        )
        assert passes
    finally:
        cluster.close()
        receiver.shutdown()
