"""Runs a real `tetra serve` on a free loopback port and talks HTTP to it (stdlib only).

Environment: TETRA_BIN (the tetra binary), TETRA_SERVER_MODEL (a model folder with a
tokenizer; default tests/fixtures/qwen3_moe-tiny), TETRA_SERVE_FLAGS (flags for every server,
e.g. "--device cuda" on the GPU machine).
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TETRA = os.environ.get("TETRA_BIN", os.path.join(ROOT, "build", "tetra"))
MODEL = os.environ.get("TETRA_SERVER_MODEL", os.path.join(ROOT, "tests", "fixtures", "qwen3_moe-tiny"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *flags, wait_ready=True, env=None, model=None):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="tetra-serve-", suffix=".log", delete=False)
        # TETRA_WRAP: a command to run the server under, e.g. "gdb -batch -ex run -ex bt --args".
        self.cmd = os.environ.get("TETRA_WRAP", "").split() + [TETRA, "serve", "--model", model or MODEL, "--port", str(self.port), "--threads", "1", *os.environ.get("TETRA_SERVE_FLAGS", "").split(), *flags]
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        if wait_ready:
            self.wait_ready()

    def wait_ready(self, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("tetra serve exited with %d:\n%s" % (self.proc.returncode, self.log_text()))
            try:
                status, _, _ = self.request("GET", "/health", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("tetra serve did not become ready:\n" + self.log_text())

    def log_text(self):
        with open(self.log.name, "r", errors="replace") as f:
            return f.read()[-4000:]

    def connection(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=60):
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def post(self, path, obj, timeout=120):
        body = obj if isinstance(obj, (bytes, str)) else json.dumps(obj)
        status, headers, data = self.request("POST", path, body, {"Content-Type": "application/json"}, timeout)
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = None
        return status, parsed, headers

    def complete(self, **fields):
        return self.post("/v1/completions", fields)

    def stream(self, path, obj, timeout=120):
        """Streams a request; returns (status, [event payload strings], raw body bytes)."""
        conn = self.connection(timeout)
        try:
            conn.request("POST", path, body=json.dumps(obj), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            raw = r.read()
            if r.status != 200:
                return r.status, [], raw
            return r.status, parse_sse(raw), raw
        finally:
            conn.close()

    def metrics(self):
        status, _, body = self.request("GET", "/metrics")
        assert status == 200, status
        return parse_metrics(body.decode())

    def rss_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def wait_idle(self, timeout=5.0):
        """Waits until no request runs or waits and every KV block is free; returns the metrics."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            idle = (m.get("tetra_num_requests_running", 0) == 0 and m.get("tetra_num_requests_waiting", 0) == 0
                    and m.get('tetra_kv_blocks{state="used"}', 0) == 0)
            if idle or time.time() > deadline:
                return m
            time.sleep(0.05)

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def parse_sse(raw):
    """Splits an SSE body into event payloads, checking the framing of each event."""
    text = raw.decode("utf-8")  # strict: a split UTF-8 character fails here
    assert text.endswith("\n\n"), repr(text[-40:])
    events = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), repr(block[:80])
        assert "\n" not in block, repr(block[:80])
        events.append(block[len("data: "):])
    return events


def stream_chunks(events):
    """The JSON chunks of a stream (everything before data: [DONE], which must end it)."""
    assert events and events[-1] == "[DONE]", events[-3:]
    assert "[DONE]" not in events[:-1]
    return [json.loads(e) for e in events[:-1]]


# On the GPU a row's numbers depend a little on the batch around it (BF16, and GEMM and
# attention kernels chosen by the batch's size). Most differences only move log-probs, but
# where a token's router logits are nearly tied it may go to another expert, and the text
# then parts for good (measured on the H200: qwen3_moe-tiny's router logits agree to NMSE
# 4e-5 while one token of 14 changes expert). So greedy text from a batch equals the same
# prompt alone on the CPU, and on the GPU only up to where it first parts, which is reported.
ON_GPU = "--device cuda" in os.environ.get("TETRA_SERVE_FLAGS", "")


def completion_tokens(choice):
    """The tokens of a completions choice asked with logprobs."""
    return choice["logprobs"]["tokens"]


def stream_tokens(chunks, index=0):
    """The same for a streamed completion: every chunk's logprobs, in order."""
    tokens = []
    for c in chunks:
        for ch in c.get("choices", []):
            if ch["index"] == index and ch.get("logprobs"):
                tokens += ch["logprobs"]["tokens"]
    return tokens


def assert_same_greedy(test, got, want, msg=None):
    """got, want: (text, tokens). The CPU: the same text. The GPU: the same number of tokens,
    and where they first differ is printed (see ON_GPU)."""
    if not ON_GPU:
        test.assertEqual(got[0], want[0], msg)
        return
    test.assertEqual(len(got[1]), len(want[1]), msg)
    first = next((i for i, (a, b) in enumerate(zip(got[1], want[1])) if a != b), None)
    if first is not None:
        print("%s: the batched text parts from the reference at token %d of %d (GPU)" % (msg, first, len(got[1])))


def stream_text(chunks, index=0):
    out = []
    for c in chunks:
        for ch in c.get("choices", []):
            if ch["index"] == index:
                out.append(ch.get("text") if "text" in ch else ch["delta"].get("content", "") or "")
    return "".join(out)


def stream_finish(chunks, index=0):
    reasons = [ch["finish_reason"] for c in chunks for ch in c.get("choices", [])
               if ch["index"] == index and ch["finish_reason"]]
    assert len(reasons) == 1, reasons
    return reasons[0]


_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$")


def parse_metrics(text):
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _METRIC.match(line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def assert_error(test, status, body, want_status, param=None):
    test.assertEqual(status, want_status, body)
    test.assertIsInstance(body, dict, body)
    err = body["error"]
    for key in ("message", "type", "param", "code"):
        test.assertIn(key, err)
    test.assertTrue(err["message"])
    if param is not None:
        test.assertEqual(err["param"], param, err)
