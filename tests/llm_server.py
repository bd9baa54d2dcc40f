"""A tiny OpenAI-compatible chat server on loopback that replays recorded answers.

Tests point the real `openai` client at it (no patched client), so the whole HTTP path runs:
status codes, headers, timeouts, dropped connections. A recording matches a request when all of
its `match` substrings occur in the last user message (the most specific recording wins) and
answers it; its `faults` script what happens to the 1st, 2nd, ... matching request:

    "ok"          answer (the default once the script is used up)
    "429"         HTTP 429 with `Retry-After: 0`
    "500", "503"  a server error (any 5xx); "400", "401", ... a client error
    "sleep:S"     sleep S seconds, then answer (the client has usually given up by then)
    "drop"        close the connection without a response
    "malformed"   HTTP 200 whose message content is prose, not JSON

Answers are `{"json": {...}}` (sent as indented JSON; a "host_code" given as a list of lines is
joined, so that fixtures stay readable) or `{"text": "..." | [lines]}` (sent as is); the n-th
answered request gets `answers[n]` (the last one once they run out). Every request is kept in
`requests` (and the usage of every answer in `usages`) so tests can count calls.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "llm"
MALFORMED = (
    "Sure! The wrapper checks that the tensors live on the GPU, allocates the output and "
    "launches the kernel with 256 threads per block."
)


def load(name: str) -> list[dict]:
    """The recordings of fixtures/llm/<name>.json (a fresh copy: tests may edit them)."""
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    return copy.deepcopy(data["recordings"])


def content_of(answer: dict) -> str:
    """The message content a recorded answer is sent as."""
    if "text" in answer:
        text = answer["text"]
        return "\n".join(text) if isinstance(text, list) else text
    obj = copy.deepcopy(answer["json"])
    if isinstance(obj.get("host_code"), list):
        obj["host_code"] = "\n".join(obj["host_code"])
    return json.dumps(obj, indent=2)


def _tokens(text: str) -> int:
    return len(text) // 4 + 1


class FakeLLM:
    """The server; use as a context manager, then `base_url` and `requests`."""

    def __init__(self, recordings: list[dict], model: str = "fake-model") -> None:
        self.recordings = recordings
        self.model = model
        self.requests: list[dict] = []
        self.usages: list[dict] = []  # the usage block of every answer sent
        self.in_flight = self.max_in_flight = 0
        self._hits: dict[int, int] = {}
        self._served: dict[int, int] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None, "server not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> FakeLLM:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._server.block_on_close = False  # never wait for a handler still sleeping
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def chat_requests(self, *needles: str) -> list[dict]:
        """Chat requests whose last user message contains every needle."""
        return [
            r
            for r in self.requests
            if r["path"].endswith("/chat/completions") and all(n in r["last_user"] for n in needles)
        ]

    # request handling (server threads) ----------------------------------------------------------
    def plan(self, last_user: str) -> tuple[int | None, str, str]:
        """(recording index, fault, answer content) for a request."""
        matches = [
            (len(rec["match"]), -i, i)
            for i, rec in enumerate(self.recordings)
            if all(m in last_user for m in rec["match"])
        ]
        if not matches:
            return None, "404", ""
        index = max(matches)[2]
        rec = self.recordings[index]
        with self._lock:
            hit = self._hits.get(index, 0)
            self._hits[index] = hit + 1
            faults = rec.get("faults", [])
            fault = faults[hit] if hit < len(faults) else "ok"
            if fault == "ok" or fault.startswith("sleep") or fault == "malformed":
                served = self._served.get(index, 0)
                self._served[index] = served + 1
                answers = rec["answers"]
                content = content_of(answers[min(served, len(answers) - 1)])
            else:
                content = ""
        return index, fault, MALFORMED if fault == "malformed" else content

    def completion(self, body: dict, content: str) -> dict:
        prompt = "".join(str(m.get("content", "")) for m in body.get("messages", []))
        usage = {"prompt_tokens": _tokens(prompt), "completion_tokens": _tokens(content)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        with self._lock:
            self.usages.append(usage)
        return {
            "id": f"chatcmpl-fake-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }


class _Handler(BaseHTTPRequestHandler):
    fake: FakeLLM

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            model = {"id": self.fake.model, "object": "model", "owned_by": "kminer-tests"}
            self._send(200, {"object": "list", "data": [model]})
        else:
            self._send(404, _error("not found", "not_found_error"))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        last_user = str(users[-1].get("content", "")) if users else ""
        fake = self.fake
        with fake._lock:
            fake.in_flight += 1
            fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
        self._counted = True
        try:
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._record(body, last_user, None, "404")
                self._send(404, _error("not found", "not_found_error"))
                return
            index, fault, content = fake.plan(last_user)
            self._record(body, last_user, index, fault)
            self._act(fault, body, content, last_user)
        finally:
            self._leave()

    def _leave(self) -> None:
        """The request stops counting as in flight before its answer's first byte leaves.

        The client frees its slot once it has the answer and may send the next request at once;
        counting down only after the write would let that request overlap this one on paper.
        """
        if getattr(self, "_counted", False):
            self._counted = False
            with self.fake._lock:
                self.fake.in_flight -= 1

    def _record(self, body: dict, last_user: str, index: int | None, fault: str) -> None:
        name = None if index is None else self.fake.recordings[index].get("name", str(index))
        with self.fake._lock:
            self.fake.requests.append(
                {
                    "path": self.path,
                    "authorization": self.headers.get("Authorization", ""),
                    "body": body,
                    "last_user": last_user,
                    "recording": name,
                    "fault": fault,
                }
            )

    def _act(self, fault: str, body: dict, content: str, last_user: str) -> None:
        if fault == "drop":
            self.close_connection = True
            return
        if fault == "404":
            msg = f"fake server: no recording matches {last_user[:120]!r}"
            self._send(400, _error(msg, "invalid_request_error"))
            return
        if fault == "429":
            self._send(429, _error("rate limited", "rate_limit_error"), {"Retry-After": "0"})
            return
        if fault.isdigit():
            self._send(int(fault), _error(f"scripted HTTP {fault}", "server_error"))
            return
        if fault.startswith("sleep:"):
            time.sleep(float(fault.split(":", 1)[1]))
        self._send(200, self.fake.completion(body, content))

    def _send(self, status: int, payload: dict, headers: dict | None = None) -> None:
        data = json.dumps(payload).encode()
        self._leave()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
            pass


def _error(message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
