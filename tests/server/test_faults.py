"""RELIABILITY.md case 25 while loading: the listener opens first, and health, the API and
/v1/models answer 503 in the error shape until the model and KV cache are ready, then 200.

Cases 24 and 25 with an injected engine fault (TETRA_TESTING_FAIL_STEP makes
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


class Loading(unittest.TestCase):
    def test_case25_503_while_loading_then_200(self):
        # 1 GiB of KV cache takes about 1.5 s to set up here, long enough to be seen loading.
        s = Server("--kv-memory", "1G", wait_ready=False)
        try:
            seen = []  # (health status, body) in the order they came
            deadline = time.time() + 120
            while time.time() < deadline and (not seen or seen[-1][0] != 200):
                self.assertIsNone(s.proc.poll(), s.log_text())
                try:
                    status, _, body = s.request("GET", "/health", timeout=2)
                except OSError:
                    time.sleep(0.01)  # not listening yet
                    continue
                seen.append((status, body))
                if status == 503 and len(seen) == 1:
                    # While loading, requests and the model list are refused the same way.
                    st, body_c, _ = s.complete(prompt="early", max_tokens=2)
                    self.assertEqual(st, 503, body_c)
                    self.assertEqual(body_c["error"]["type"], "unavailable_error")
                    self.assertIn("loading", body_c["error"]["message"])
                    st, _, body_m = s.request("GET", "/v1/models")
                    self.assertEqual(st, 503, body_m)
                time.sleep(0.01)
            self.assertGreaterEqual(len(seen), 2, "health never answered while loading")
            self.assertEqual(seen[-1][0], 200, seen[-1])
            first_status, first_body = seen[0]
            self.assertEqual(first_status, 503, first_body)
            err = json.loads(first_body)["error"]
            self.assertIn("loading", err["message"])
            # Once ready it never goes back, and it serves.
            self.assertTrue(all(st == 503 for st, _ in seen[:-1]), [st for st, _ in seen])
            st, body, _ = s.complete(prompt="ready now", max_tokens=3, ignore_eos=True)
            self.assertEqual(st, 200, body)
            self.assertEqual(body["usage"]["completion_tokens"], 3)
        finally:
            self.assertEqual(s.stop(), 0)


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
