"""RELIABILITY.md case 26: SIGTERM drains. Running requests finish (finish_reason length),
health and new requests get 503 at once, exit 0; with --shutdown-timeout 0 or a second SIGTERM
the streams end with finish_reason abort and the process exits in under 4 s."""
import http.client
import json
import signal
import threading
import time
import unittest

from harness import Server, parse_sse, stream_chunks, stream_finish


def start_streams(s, n, max_tokens):
    results = [None] * n

    def client(i):
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
        conn.request("POST", "/v1/completions", json.dumps(
            {"prompt": "drain %d" % i, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}),
            {"Content-Type": "application/json"})
        r = conn.getresponse()
        results[i] = (r.status, r.read())
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


def wait_running(s, n, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if s.metrics()["tetra_num_requests_running"] >= n:
            return
        time.sleep(0.01)
    raise AssertionError("requests did not start")


class DrainTest(unittest.TestCase):
    def test_26_sigterm_lets_running_requests_finish(self):
        s = Server("--shutdown-timeout", "60")
        # Long enough to be running still when the checks below land, on a GPU too.
        threads, results = start_streams(s, 4, 3000)
        wait_running(s, 4)
        keep = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)  # opened before the signal
        keep.connect()
        s.signal(signal.SIGTERM)
        time.sleep(0.1)
        st, _, body = s.request("GET", "/health")
        self.assertEqual(st, 503)
        self.assertIn("error", json.loads(body))
        st, body, _ = s.complete(prompt="late", max_tokens=2)
        self.assertEqual(st, 503)
        self.assertEqual(body["error"]["type"], "unavailable_error")
        keep.close()
        for t in threads:
            t.join(120)
        for st, raw in results:
            self.assertEqual(st, 200)
            self.assertEqual(stream_finish(stream_chunks(parse_sse(raw))), "length")
        s.proc.wait(30)
        self.assertEqual(s.proc.returncode, 0, s.log_text())

    def check_abort(self, flags, signals):
        s = Server(*flags)
        threads, results = start_streams(s, 4, 3000)
        wait_running(s, 4)
        t0 = time.time()
        for sig in signals:
            s.signal(sig)
            time.sleep(0.05)
        s.proc.wait(10)
        elapsed = time.time() - t0
        for t in threads:
            t.join(10)
        self.assertEqual(s.proc.returncode, 0, s.log_text())
        self.assertLess(elapsed, 4.0)
        for st, raw in results:
            self.assertEqual(st, 200)
            self.assertEqual(stream_finish(stream_chunks(parse_sse(raw))), "abort")

    def test_26_timeout_zero_aborts(self):
        self.check_abort(["--shutdown-timeout", "0"], [signal.SIGTERM])

    def test_26_second_sigterm_aborts(self):
        self.check_abort(["--shutdown-timeout", "600"], [signal.SIGTERM, signal.SIGTERM])


if __name__ == "__main__":
    unittest.main()
