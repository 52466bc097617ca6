"""hf2q's stand-in for the `utils` module of llama.cpp's server test suite (tools/server/tests in
llama.cpp b11434): the same names the tests import — ServerProcess, ServerPreset, ServerResponse,
ServerError, match_regex, … — written for `hf2q serve`, so that the suite's OpenAI-compatible tests
run unmodified against hf2q. The presets' models map to the real models the hf2q tests use
(SmolLM2-135M-Instruct Q4_1 for the chat presets, all-MiniLM-L6-v2 f16 for the embedding ones);
server options hf2q has equivalents for are passed on, the others are noted in `unsupported`.
"""
import json
import os
import re
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, List, Tuple

import requests

HF2Q = os.environ["HF2Q_BIN"]
CHAT_MODEL = os.environ["HF2Q_CHAT_MODEL"]
EMBED_MODEL = os.environ["HF2Q_EMBED_MODEL"]
# The suite's folder (run.py sets it), with llama.cpp's chat templates in templates/.
SUITE_DIR = os.environ.get("HF2Q_LLAMA_TESTS", "")
DEFAULT_HTTP_TIMEOUT = 60
DEFAULT_REQUEST_TIMEOUT = 600

server_instances: set = set()


class ServerResponse:
    headers: dict
    status_code: int
    body: Any


class ServerError(Exception):
    def __init__(self, code, body):
        self.code = code
        self.body = body


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self):
        self.server_host = "127.0.0.1"
        self.server_port = _free_port()
        self.model = CHAT_MODEL
        self.model_alias = None
        self.n_ctx = None
        self.n_slots = None
        self.n_batch = None
        self.api_key = None
        self.embedding = False
        self.pooling = None
        self.jinja = None
        self.chat_template = None
        self.chat_template_file = None
        self.n_predict = None
        self.temperature = None
        self.seed = None
        self.debug = False
        self.process = None
        # Options of llama-server that hf2q serve does not take (tests that depend on them are
        # listed in expected_failures.txt).
        self.unsupported = []

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)

    def start(self, timeout_seconds: int = DEFAULT_HTTP_TIMEOUT) -> None:
        args = [HF2Q, "serve", "-m", self.model, "--host", self.server_host, "--port", str(self.server_port), "-t", "2"]
        if self.model_alias:
            args += ["--alias", self.model_alias]
        if self.n_ctx:
            # llama-server's --ctx-size is shared by its slots; hf2q's -c is per slot.
            slots = self.n_slots or 1
            args += ["-c", str(max(64, self.n_ctx // slots))]
        if self.n_slots:
            args += ["--parallel", str(self.n_slots)]
        if self.api_key:
            args += ["--api-key", self.api_key]
        if self.chat_template_file is not None:
            # The tests name llama.cpp's models/templates, which fetch-models puts beside the suite.
            name = os.path.basename(self.chat_template_file)
            args += ["--chat-template-file", os.path.join(SUITE_DIR, "templates", name)]
        if self.debug:
            args += ["--debug-responses"]
        if self.chat_template is not None:
            args += ["--chat-template", self.chat_template]
        if self.n_batch:
            args += ["--batch-size", str(self.n_batch)]
        # llama-server's presets run with --seed 42: requests without a seed are reproducible.
        args += ["--seed", str(self.seed if self.seed is not None else 42)]
        if self.pooling is not None:
            args += ["--pooling", self.pooling]
        for opt in ("n_predict", "temperature"):
            if getattr(self, opt) is not None:
                self.unsupported.append(opt)
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        server_instances.add(self)
        threading.Thread(target=lambda: [None for _ in self.process.stderr], daemon=True).start()
        t0 = time.time()
        while time.time() - t0 < timeout_seconds:
            try:
                if requests.get(self.make_url("/readyz"), timeout=2).status_code == 200:
                    return
            except requests.exceptions.RequestException:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"hf2q serve exited with {self.process.returncode}: {args}")
            time.sleep(0.1)
        raise TimeoutError(f"hf2q serve did not become ready in {timeout_seconds} s")

    def stop(self) -> None:
        server_instances.discard(self)
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.process = None

    def make_url(self, path: str, host: str | None = None) -> str:
        return f"http://{host or self.server_host}:{self.server_port}{path}"

    def make_request(self, method, path, data=None, headers=None, timeout=DEFAULT_REQUEST_TIMEOUT, host=None) -> ServerResponse:
        url = self.make_url(path, host)
        fn = {"GET": requests.get, "POST": requests.post, "DELETE": requests.delete, "OPTIONS": requests.options}[method]
        kw = {"headers": headers, "timeout": timeout}
        if method == "POST":
            kw["json"] = data
        response = fn(url, **kw)
        result = ServerResponse()
        result.headers = dict(response.headers)
        result.status_code = response.status_code
        try:
            result.body = response.json() if method != "OPTIONS" else None
        except ValueError:
            result.body = response.text
        return result

    def make_stream_request(self, method, path, data=None, headers=None, host=None) -> Iterator[dict]:
        if method != "POST":
            raise ValueError(f"Unimplemented method: {method}")
        response = requests.post(self.make_url(path, host), headers=headers, json=data, stream=True)
        if response.status_code != 200:
            raise ServerError(response.status_code, response.json())
        for line_bytes in response.iter_lines():
            line = line_bytes.decode("utf-8")
            if "[DONE]" in line:
                break
            if line.startswith("data: "):
                yield json.loads(line[6:])


class ServerPreset:
    @staticmethod
    def load_all() -> None:
        pass

    @staticmethod
    def _chat() -> ServerProcess:
        s = ServerProcess()
        s.n_ctx = 512
        s.n_slots = 2
        return s

    tinyllama2 = _chat
    stories15m_moe = _chat
    tinygemma3 = _chat
    tinyllama_infill = _chat

    @staticmethod
    def bert_bge_small() -> ServerProcess:
        s = ServerProcess()
        s.model = EMBED_MODEL
        s.embedding = True
        s.n_ctx = 512
        s.n_slots = 2
        return s

    bert_bge_small_with_fa = bert_bge_small


def parallel_function_calls(function_list: List[Tuple[Callable[..., Any], Tuple[Any, ...]]]) -> List[Any]:
    with ThreadPoolExecutor(max_workers=max(1, len(function_list))) as ex:
        futures = [ex.submit(f, *a) for f, a in function_list]
        return [f.result() for f in futures]


def match_regex(regex: str, text: str) -> bool:
    return re.compile(regex, flags=re.IGNORECASE | re.MULTILINE | re.DOTALL).search(text) is not None


def is_slow_test_allowed():
    return os.environ.get("SLOW_TESTS") == "1"
