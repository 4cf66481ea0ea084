"""A stand-in engine for the agent's tests: answers /health and /metrics.

Takes the sim engine's command line (``--host --port --model --threads``)
plus behaviour switches a profile's args can carry:

- ``--exit-with CODE``: print a line and exit at once with CODE;
- ``--never-ready``: /health answers 503 forever;
- ``--running N --waiting N --kv F``: the figures /metrics reports; its prefix cache's
  counters grow by 100 tokens looked up and 30 found at each read.

/metrics wants the key from ``LLMGW_ENGINE_API_KEY``, as a real engine would.
"""

import argparse
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int)
    p.add_argument("--exit-with", type=int)
    p.add_argument("--never-ready", action="store_true")
    p.add_argument("--running", type=int, default=2)
    p.add_argument("--waiting", type=int, default=1)
    p.add_argument("--kv", type=float, default=0.25)
    args, _ = p.parse_known_args()
    print(f"fake engine for {args.model} on {args.host}:{args.port}", flush=True)
    if args.exit_with is not None:
        print("fatal: the model file is not a GGUF file", flush=True)
        sys.exit(args.exit_with)
    key = os.environ.get("LLMGW_ENGINE_API_KEY", "")
    reads = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/health":
                self._answer(503 if args.never_ready else 200, "ok\n")
            elif self.path == "/metrics":
                if self.headers.get("Authorization") != f"Bearer {key}":
                    self._answer(401, "unauthorized\n")
                    return
                reads[0] += 1
                self._answer(
                    200,
                    (
                        f"vllm:prefix_cache_queries_total {100 * reads[0]}\n"
                        f"vllm:prefix_cache_hits_total {30 * reads[0]}\n"
                        "# TYPE llmgw_sim:requests_running gauge\n"
                        f'llmgw_sim:requests_running{{model_name="{args.model}"}} {args.running}\n'
                        f"llmgw_sim:requests_waiting {args.waiting}\n"
                        f"llmgw_sim:kv_cache_usage_perc {args.kv}\n"
                    ),
                )
            else:
                self._answer(404, "not found\n")

        def _answer(self, status: int, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a: object) -> None:
            pass

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
