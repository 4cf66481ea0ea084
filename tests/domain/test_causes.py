"""The line of an engine's log that says why it failed (fleet/domain/causes.py), on excerpts
of real llama-server and vLLM logs, and how a failure and an exit read in one line."""

import pytest
from hypothesis import given, strategies as st

from fleet.domain.causes import (
    MOST_CHARS,
    cause,
    clean,
    ended_said,
    exit_said,
    signal_name,
    summary,
)

# llama-server (llama.cpp 0.3.36 as `llmgw engines build llamacpp` makes it) on a file that
# is not a GGUF, as the issue found it: its last 12 lines, as written.
LLAMA_NOT_GGUF = """\
0.00.017.638 I srv    load_model: loading model '/tmp/notes.gguf'
0.00.017.754 E gguf_init_from_reader: invalid magic characters: 'This', expected 'GGUF'
0.00.017.838 E llama_model_load: error loading model: llama_model_loader: failed to load model from /tmp/notes.gguf
0.00.017.844 E llama_model_load_from_file_impl: failed to load model
0.00.017.862 E common_fit_params: encountered an error while trying to fit params to free device memory: failed to load model
0.00.017.872 E gguf_init_from_reader: invalid magic characters: 'This', expected 'GGUF'
0.00.017.877 E llama_model_load: error loading model: llama_model_loader: failed to load model from /tmp/notes.gguf
0.00.017.878 E llama_model_load_from_file_impl: failed to load model
0.00.017.879 E cmn  common_init_: failed to load model '/tmp/notes.gguf'
0.00.017.880 E srv    load_model: failed to load model, '/tmp/notes.gguf'
0.00.017.880 I srv    operator(): operator(): cleaning up before exit...
0.00.018.339 E srv  llama_server: exiting due to model loading error"""

# llama-server, older log format without timestamps, on a file that is not there.
LLAMA_MISSING = """\
main: loading model
srv    load_model: loading model '/nowhere/missing.gguf'
gguf_init_from_file: failed to open GGUF file '/nowhere/missing.gguf'
llama_model_load: error loading model: llama_model_loader: failed to load model from /nowhere/missing.gguf
llama_model_load_from_file_impl: failed to load model
srv    load_model: failed to load model, '/nowhere/missing.gguf'
main: exiting due to model loading error"""

LLAMA_MISSING_NOW = """\
0.00.016.845 E common_fit_params: encountered an error while trying to fit params to free device memory: failed to load model
0.00.016.861 E gguf_init_from_file: failed to open GGUF file '/nowhere/missing.gguf' (No such file or directory)
0.00.016.866 E llama_model_load: error loading model: llama_model_loader: failed to load model from /nowhere/missing.gguf
0.00.016.866 E llama_model_load_from_file_impl: failed to load model
0.00.016.867 E cmn  common_init_: failed to load model '/nowhere/missing.gguf'
0.00.016.869 E srv    load_model: failed to load model, '/nowhere/missing.gguf'
0.00.016.870 I srv    operator(): operator(): cleaning up before exit...
0.00.017.220 E srv  llama_server: exiting due to model loading error"""

# llama-server 0.3.36 on a port another process holds, as written.
LLAMA_PORT_TAKEN = """\
0.00.005.711 W srv  llama_server: security: no API key is set and CORS allows all origins (see https://github.com/ggml-org/llama.cpp/pull/25655)
0.00.005.788 E srv         start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 33999
0.00.005.788 I srv    operator(): operator(): cleaning up before exit...
0.00.005.876 E srv  llama_server: exiting due to HTTP server error"""

LLAMA_ARCH = """\
llama_model_loader: - kv   0:                       general.architecture str              = mamba9
llama_model_load: error loading model: error loading model architecture: unknown model architecture: 'mamba9'
llama_model_load_from_file_impl: failed to load model
main: exiting due to model loading error"""

# vLLM 0.10: the engine core dies of CUDA OOM; the API server then says "see above".
VLLM_OOM = """\
(EngineCore_0 pid=104) INFO 05-05 12:36:40 [gpu_model_runner.py:1686] Graph capturing finished in 12 secs, took 0.95 GiB
(EngineCore_0 pid=104) ERROR 05-05 12:36:59 [core.py:700] EngineCore failed to start.
(EngineCore_0 pid=104) ERROR 05-05 12:36:59 [core.py:700] Traceback (most recent call last):
(EngineCore_0 pid=104) ERROR 05-05 12:36:59 [core.py:700]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 691, in run_engine_core
(EngineCore_0 pid=104) ERROR 05-05 12:36:59 [core.py:700]     engine_core = EngineCoreProc(*args, **kwargs)
(EngineCore_0 pid=104) ERROR 05-05 12:36:59 [core.py:700]                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore_0 pid=104) ERROR 05-05 12:36:59 [core.py:700] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total capacity of 23.56 GiB of which 56.88 MiB is free.
(APIServer pid=1) Traceback (most recent call last):
(APIServer pid=1)   File "/usr/local/bin/vllm", line 10, in <module>
(APIServer pid=1)     sys.exit(main())
(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"""

# vLLM 0.10: a KV cache that does not fit the asked length; the API server points back.
VLLM_KV = """\
(EngineCore_0 pid=7) ERROR 08-01 10:00:01 [core.py:700] EngineCore failed to start.
(EngineCore_0 pid=7) ERROR 08-01 10:00:01 [core.py:700] Traceback (most recent call last):
(EngineCore_0 pid=7) ERROR 08-01 10:00:01 [core.py:700]   File "/opt/vllm/v1/core/kv_cache_utils.py", line 700, in check_enough_kv_cache_memory
(EngineCore_0 pid=7) ERROR 08-01 10:00:01 [core.py:700]     raise ValueError(
(EngineCore_0 pid=7) ERROR 08-01 10:00:01 [core.py:700] ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (7.21 GiB).
(APIServer pid=1) ERROR 08-01 10:00:02 [api_server.py:1000] RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"""

# vLLM 0.6: an architecture it does not know, after a chained traceback.
VLLM_ARCH = """\
INFO 10-23 23:20:20 api_server.py:528] vLLM API server version 0.6.3.post1
ERROR 10-23 23:20:26 registry.py:272] Error in inspecting model architecture 'LlamaForCausalLM'
ERROR 10-23 23:20:26 registry.py:272] Traceback (most recent call last):
ERROR 10-23 23:20:26 registry.py:272]   File "/opt/vllm/model_executor/models/registry.py", line 434, in _run_in_subprocess
ERROR 10-23 23:20:26 registry.py:272]     returned.check_returncode()
ERROR 10-23 23:20:26 registry.py:272] subprocess.CalledProcessError: Command '['python', '-m', 'vllm.model_executor.models.registry']' returned non-zero exit status 1.
Traceback (most recent call last):
  File "/usr/local/bin/vllm", line 8, in <module>
    sys.exit(main())
ValueError: Model architectures ['LlamaForCausalLM'] are not supported for now. Supported architectures: ['AquilaModel', 'AquilaForCausalLM']"""

# vLLM 0.6: the port taken, a plain traceback.
VLLM_PORT = """\
INFO 10-10 10:23:00 api_server.py:526] vLLM API server version 0.6.1
  File "/opt/vllm/entrypoints/openai/api_server.py", line 530, in run_server
Traceback (most recent call last):
  File "/opt/vllm/entrypoints/openai/api_server.py", line 530, in run_server
    temp_socket.bind(("", args.port))
OSError: [Errno 98] Address already in use"""

PLAIN_PYTHON = """\
Traceback (most recent call last):
  File "/usr/lib/python3.11/runpy.py", line 198, in _run_module_as_main
ModuleNotFoundError: No module named 'vllm'"""


@pytest.mark.parametrize(
    ("case", "log", "expected"),
    [
        (
            "llama-server on a file that is not a GGUF: the line three lines above its last",
            LLAMA_NOT_GGUF,
            "invalid magic characters: 'This', expected 'GGUF'",
        ),
        (
            "llama-server 0.3.36 on a missing file",
            LLAMA_MISSING_NOW,
            "failed to open GGUF file '/nowhere/missing.gguf' (No such file or directory)",
        ),
        (
            "llama-server on a missing file: the first error line",
            LLAMA_MISSING,
            "failed to open GGUF file '/nowhere/missing.gguf'",
        ),
        (
            "llama-server on a port taken",
            LLAMA_PORT_TAKEN,
            "start: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 33999",
        ),
        (
            "llama-server on an architecture it does not know",
            LLAMA_ARCH,
            "error loading model: error loading model architecture: unknown model "
            "architecture: 'mamba9'",
        ),
        (
            "vLLM out of GPU memory: the engine core's error, not the server's 'see above'",
            VLLM_OOM,
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 "
            "has a total capacity of 23.56 GiB of which 56.88 MiB is free.",
        ),
        (
            "vLLM's KV cache too small for the length: the traceback's last line",
            VLLM_KV,
            "ValueError: To serve at least one request with the models's max seq len "
            "(131072), (16.00 GiB KV cache is needed, which is larger than the available "
            "KV cache memory (7.21 GiB).",
        ),
        (
            "vLLM's chained traceback: the last one's error",
            VLLM_ARCH,
            "ValueError: Model architectures ['LlamaForCausalLM'] are not supported for now. "
            "Supported architectures: ['AquilaModel', 'AquilaForCausalLM']",
        ),
        ("vLLM's port taken", VLLM_PORT, "OSError: [Errno 98] Address already in use"),
        ("a Python program", PLAIN_PYTHON, "ModuleNotFoundError: No module named 'vllm'"),
        ("a log that says nothing wrong", "loading\nlistening on 8000", None),
        ("no log", "", None),
    ],
)
def test_the_line_that_says_why(case, log, expected):
    assert cause(log.splitlines()) == expected, case


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "0.00.007.248 E srv llama_server: exiting due to model loading error",
            "exiting due to model loading error",
        ),
        ("(APIServer pid=1) ERROR 05-05 12:36:59 [serving.py:1173] boom", "boom"),
        ("ERROR 12-16 21:40:15 engine.py:135] boom", "boom"),
        ("2026-06-09 14:01:54.604 [Info] (Process) x", "(Process) x"),
        ("[2024-01-02T03:04:05Z] ValueError: x", "ValueError: x"),
        ("ValueError: x", "ValueError: x"),
        ("   indented   ", "indented"),
    ],
)
def test_a_line_is_cleaned_of_timestamps_levels_and_tags(line, expected):
    assert clean(line) == expected


def test_a_long_cause_is_cut():
    said = cause(["ValueError: " + "x" * 1000])
    assert said is not None and len(said) == MOST_CHARS and said.endswith("…")


@pytest.mark.parametrize(
    ("detail", "expected"),
    [
        (
            "The engine exited with code 1.\n" + LLAMA_NOT_GGUF,
            "invalid magic characters: 'This', expected 'GGUF'",
        ),
        (
            "The engine did not answer /health within 60 s.\n" + VLLM_KV,
            VLLM_KV.splitlines()[4].split("] ", 1)[1],
        ),
        ("The engine exited with code 0.\nloading\nbye", "The engine exited with code 0."),
        (
            "replica chat-1 did not become ready within 10m0s\n" + VLLM_OOM,
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 "
            "has a total capacity of 23.56 GiB of which 56.88 MiB is free.",
        ),
        (
            "replica chat-1 did not become ready within 10m0s",
            "replica chat-1 did not become ready within 10m0s",
        ),
        # The agent's own cause wins over whatever the log said.
        (
            "llama-server used 11.2 GB of its 2 GB reservation; stopped. Raise the profile's "
            "memory or lower --ctx-size.\nllama_model_load: error loading model",
            "llama-server used 11.2 GB of its 2 GB reservation; stopped. Raise the profile's "
            "memory or lower --ctx-size.",
        ),
        ("Fetching the weights failed: disk full.", "Fetching the weights failed: disk full."),
        ("", ""),
        ("\n\n", ""),
    ],
)
def test_a_failure_in_one_line(detail, expected):
    assert summary(detail) == expected


@pytest.mark.parametrize(
    ("code", "name", "ended", "said"),
    [
        (-15, "SIGTERM", "The engine was stopped by SIGTERM.", "stopped by SIGTERM"),
        (-9, "SIGKILL", "The engine was stopped by SIGKILL.", "stopped by SIGKILL"),
        (-11, "SIGSEGV", "The engine was stopped by SIGSEGV.", "stopped by SIGSEGV"),
        (1, None, "The engine exited with code 1.", "exit code 1"),
        (137, None, "The engine exited with code 137.", "exit code 137"),
        (None, None, "The engine exited.", ""),
    ],
)
def test_an_exit_by_signal_names_the_signal(code, name, ended, said):
    assert signal_name(code) == name
    assert ended_said(code) == ended
    assert exit_said(code) == said


@given(st.lists(st.text(max_size=200), max_size=30))
def test_a_cause_is_one_of_the_lines_cleaned_and_short(lines):
    found = cause(lines)
    if found is not None:
        assert "\n" not in found and len(found) <= MOST_CHARS
        assert any(found.rstrip("…") in clean(line) for line in lines)


@given(st.text(max_size=2000))
def test_a_summary_is_one_line_and_never_fails(detail):
    said = summary(detail)
    assert "\n" not in said and "\r" not in said.strip("\r")
    assert len(said) <= MOST_CHARS
