"""RELIABILITY.md cases 24 and 25 with an injected engine fault (TETRA_TESTING_FAIL_STEP makes
that forward throw, as a device fault would): a stream that was running gets an error event
and then [DONE]; a non-streamed request gets a 500 in the OpenAI error shape; health stops
saying 200 at once and the process drains and exits with status 1 within 5 s, so a supervisor
restarts it. A malformed value is refused at startup."""
import json
import subprocess
import time
import unittest

from harness import MODEL, TETRA, Server


def wait_unhealthy_then_exit(s, timeout=5.0):
    """Polls /health after the fault: it must never say 200 again; returns the exit status."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if s.proc.poll() is not None:
            return s.proc.returncode
        try:
            status, _, _ = s.request("GET", "/health", timeout=1)
            assert status == 503, status
        except OSError:
            pass  # the listener closed on exit
        time.sleep(0.02)
    raise AssertionError("tetra serve still running %.0f s after the fault:\n%s" % (timeout, s.log_text()))


class InjectedFault(unittest.TestCase):
    def test_case24_stream_gets_error_event_then_done_and_case25_exit_1(self):
        # Step 0 is the prompt, steps 1 and 2 make tokens, step 3 fails.
        s = Server(env={"TETRA_TESTING_FAIL_STEP": "3"})
        try:
            status, events, raw = s.stream("/v1/completions", {
                "prompt": "fault", "max_tokens": 64, "ignore_eos": True, "stream": True})
            self.assertEqual(status, 200, raw[:300])
            self.assertEqual(events[-1], "[DONE]", events[-3:])
            error = json.loads(events[-2])
            self.assertIn("error", error, events[-3:])
            self.assertEqual(error["error"]["type"], "server_error")
            self.assertIn("injected fault", error["error"]["message"])
            chunks = [json.loads(e) for e in events[:-2]]
            self.assertGreaterEqual(len(chunks), 1)  # tokens made before the fault arrived first
            for c in chunks:
                self.assertEqual(c["object"], "text_completion")
                self.assertIsNone(c["choices"][0]["finish_reason"])
            self.assertEqual(wait_unhealthy_then_exit(s), 1)
            self.assertIn("the engine failed a step", s.log_text())
        finally:
            s.stop()

    def test_non_streamed_request_gets_500(self):
        s = Server(env={"TETRA_TESTING_FAIL_STEP": "0"})
        try:
            status, body, _ = s.complete(prompt="fault", max_tokens=8)
            self.assertEqual(status, 500, body)
            self.assertEqual(body["error"]["type"], "server_error")
            self.assertIn("injected fault", body["error"]["message"])
            self.assertEqual(wait_unhealthy_then_exit(s), 1)
        finally:
            s.stop()

    def test_malformed_value_is_refused_at_startup(self):
        p = subprocess.run([TETRA, "serve", "--model", MODEL, "--port", "0"], capture_output=True, text=True,
                           timeout=60, env={"TETRA_TESTING_FAIL_STEP": "soon", "PATH": "/usr/bin:/bin"})
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("TETRA_TESTING_FAIL_STEP must be a step number", p.stderr)


if __name__ == "__main__":
    unittest.main()
