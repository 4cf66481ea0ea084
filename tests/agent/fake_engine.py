"""A stand-in engine for the agent's tests: answers /health and /metrics.

Takes the sim engine's command line (``--host --port --model --threads``)
plus behaviour switches a profile's args can carry:

- ``--exit-with CODE``: print a line and exit at once with CODE;
- ``--never-ready``: /health answers 503 forever;
- ``--running N --waiting N --kv F``: the figures /metrics reports; its prefix cache's
  counters grow by 100 tokens looked up and 30 found at each read;
- ``--traceback``: print a Python traceback and 40 lines of noise, then exit 1;
- ``--kill-self SIGNAL``: once up, end by that signal (9: as the kernel's OOM killer does);
- ``--grow-mb N``: once up, take N MB more resident memory every 0.1 s, without end.

/metrics wants the key from ``LLMGW_ENGINE_API_KEY``, as a real engine would.
"""

import argparse
import os
import sys
import threading
import time
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
    p.add_argument("--traceback", action="store_true")
    p.add_argument("--kill-self", type=int)
    p.add_argument("--grow-mb", type=int)
    args, _ = p.parse_known_args()
    print(f"fake engine for {args.model} on {args.host}:{args.port}", flush=True)
    if args.exit_with is not None:
        print("fatal: the model file is not a GGUF file", flush=True)
        sys.exit(args.exit_with)
    if args.traceback:
        print("Traceback (most recent call last):", flush=True)
        print('  File "engine.py", line 1, in <module>', flush=True)
        print("ValueError: the model's max seq len is larger than the KV cache", flush=True)
        for i in range(40):
            print(f"INFO shutting down worker {i}", flush=True)
        sys.exit(1)
    if args.kill_self is not None:
        threading.Timer(0.5, os.kill, (os.getpid(), args.kill_self)).start()
    if args.grow_mb:
        threading.Thread(target=_grow, args=(args.grow_mb,), daemon=True).start()
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


def _grow(mb: int) -> None:
    held = []
    while True:
        # Written, not only allocated: untouched pages are not resident.
        held.append(b"\x01" * (mb << 20))
        time.sleep(0.1)


if __name__ == "__main__":
    main()
