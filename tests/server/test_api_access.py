"""What clients rely on beyond the request schema: the API key, the served model names,
GET /v1/models/{id}, CORS, the access and throughput log lines, and `tetra --version`."""
import json
import re
import subprocess
import time
import unittest

from harness import MODEL, TETRA, Server, assert_error, parse_sse

KEY = "sk-test-0123456789"
ORIGIN = "http://app.example"


def get_json(s, path, headers=None):
    status, hdrs, body = s.request("GET", path, headers=headers or {})
    return status, json.loads(body), hdrs


def post_json(s, path, obj, headers=None):
    h = {"Content-Type": "application/json", **(headers or {})}
    status, hdrs, body = s.request("POST", path, json.dumps(obj), h)
    return status, json.loads(body), hdrs


class ApiKeyAndNamesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Server("--api-key", KEY, "--served-model-name", "alpha", "org/beta",
                       "--allowed-origins", '["%s"]' % ORIGIN, "--log-stats-interval", "0.2")
        cls.auth = {"Authorization": "Bearer " + KEY}

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0, cls.s.log_text()

    def test_v1_needs_the_key(self):
        for headers, what in [({}, "no header"), ({"Authorization": "Bearer wrong"}, "wrong key"),
                              ({"Authorization": "Bearer " + KEY + "x"}, "longer key"),
                              ({"Authorization": KEY}, "no scheme")]:
            status, body, hdrs = get_json(self.s, "/v1/models", headers)
            assert_error(self, status, body, 401)
            self.assertEqual(body["error"]["code"], "invalid_api_key", what)
            self.assertEqual(body["error"]["type"], "invalid_request_error", what)
            self.assertEqual(hdrs.get("WWW-Authenticate"), "Bearer", what)
        status, body, _ = post_json(self.s, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert_error(self, status, body, 401)
        status, body, _ = get_json(self.s, "/v1/models", self.auth)
        self.assertEqual(status, 200, body)
        status, body, _ = get_json(self.s, "/v1/models", {"Authorization": "bearer " + KEY})  # the scheme is case-free
        self.assertEqual(status, 200, body)
        # OPTIONS is not checked (vLLM's rule); without a preflight's headers no route takes it.
        status, _, body = self.s.request("OPTIONS", "/v1/models")
        self.assertEqual(status, 405, body)

    def test_health_metrics_and_version_stay_open(self):
        self.assertEqual(self.s.request("GET", "/health")[0], 200)
        self.assertEqual(self.s.request("GET", "/metrics")[0], 200)
        status, body, _ = get_json(self.s, "/version")
        self.assertEqual(status, 200)
        cli = subprocess.run([TETRA, "--version"], capture_output=True, text=True).stdout.strip()
        self.assertEqual("tetra " + body["version"], cli)

    def test_models_lists_every_served_name(self):
        status, body, _ = get_json(self.s, "/v1/models", self.auth)
        self.assertEqual(status, 200)
        self.assertEqual([m["id"] for m in body["data"]], ["alpha", "org/beta"])

    def test_model_by_id(self):
        status, body, _ = get_json(self.s, "/v1/models/org/beta", self.auth)
        self.assertEqual(status, 200, body)
        self.assertEqual((body["id"], body["object"]), ("org/beta", "model"))
        status, body, _ = get_json(self.s, "/v1/models/org%2Fbeta", self.auth)
        self.assertEqual((status, body["id"]), (200, "org/beta"))
        status, body, _ = get_json(self.s, "/v1/models/gamma", self.auth)
        assert_error(self, status, body, 404)
        self.assertEqual(body["error"]["code"], "model_not_found")
        status, body, _ = get_json(self.s, "/v1/models/alpha")  # the key guards this one too
        assert_error(self, status, body, 401)

    def test_request_model_is_checked(self):
        for name in ["alpha", "org/beta", None]:
            req = {"prompt": "hi", "max_tokens": 2}
            if name:
                req["model"] = name
            status, body, _ = post_json(self.s, "/v1/completions", req, self.auth)
            self.assertEqual(status, 200, body)
            self.assertEqual(body["model"], "alpha")  # the first served name, as vLLM answers
        for path, req in [("/v1/completions", {"prompt": "hi", "max_tokens": 2, "model": "gpt-4"}),
                          ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                    "max_tokens": 2, "model": "alpha2"})]:
            status, body, _ = post_json(self.s, path, req, self.auth)
            assert_error(self, status, body, 404, "model")
            self.assertEqual(body["error"]["code"], "model_not_found")

    def test_cors_preflight_and_headers(self):
        pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
               "Access-Control-Request-Headers": "authorization, content-type"}
        status, hdrs, _ = self.s.request("OPTIONS", "/v1/chat/completions", headers=pre)  # no key needed
        self.assertEqual(status, 200)
        self.assertEqual(hdrs.get("Access-Control-Allow-Origin"), ORIGIN)
        self.assertIn("POST", hdrs.get("Access-Control-Allow-Methods", ""))
        self.assertEqual(hdrs.get("Access-Control-Allow-Headers"), "authorization, content-type")
        status, hdrs, _ = self.s.request("OPTIONS", "/v1/chat/completions", headers={**pre, "Origin": "http://evil.example"})
        self.assertEqual(status, 400)
        self.assertNotIn("Access-Control-Allow-Origin", hdrs)

        _, _, hdrs = get_json(self.s, "/v1/models", {**self.auth, "Origin": ORIGIN})
        self.assertEqual(hdrs.get("Access-Control-Allow-Origin"), ORIGIN)
        self.assertEqual(hdrs.get("Vary"), "Origin")
        _, _, hdrs = get_json(self.s, "/v1/models", {**self.auth, "Origin": "http://evil.example"})
        self.assertNotIn("Access-Control-Allow-Origin", hdrs)
        # Errors and streams carry it too: a browser cannot read a 401 without it.
        _, _, hdrs = get_json(self.s, "/v1/models", {"Origin": ORIGIN})
        self.assertEqual(hdrs.get("Access-Control-Allow-Origin"), ORIGIN)
        conn = self.s.connection()
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2, "stream": True}),
                     {"Content-Type": "application/json", "Origin": ORIGIN, **self.auth})
        r = conn.getresponse()
        self.assertEqual(r.status, 200)
        self.assertEqual(r.getheader("Access-Control-Allow-Origin"), ORIGIN)
        self.assertEqual(parse_sse(r.read())[-1], "[DONE]")
        conn.close()

    def test_cors_headers_do_not_outlive_their_request(self):
        conn = self.s.connection()
        conn.request("GET", "/v1/models", headers={**self.auth, "Origin": ORIGIN})
        r = conn.getresponse()
        r.read()
        self.assertEqual(r.getheader("Access-Control-Allow-Origin"), ORIGIN)
        # The next request on the same connection is refused while its headers are read (431).
        conn.request("GET", "/v1/models", headers={**self.auth, "X-Big": "x" * 20000})
        r = conn.getresponse()
        r.read()
        self.assertEqual(r.status, 431)
        self.assertIsNone(r.getheader("Access-Control-Allow-Origin"))
        conn.close()

    def test_access_line_per_request(self):
        status, body, _ = post_json(self.s, "/v1/completions", {"prompt": "hello there", "max_tokens": 3,
                                                                "ignore_eos": True}, self.auth)
        self.assertEqual(status, 200, body)
        rid, prompt = body["id"], body["usage"]["prompt_tokens"]
        pattern = (r"request %s POST /v1/completions 200 prompt_tokens=%d generated_tokens=3 "
                   r"ttft=\d+\.\d{3}s total=\d+\.\d{3}s finish=length" % (re.escape(rid), prompt))
        deadline = time.time() + 5
        while not re.search(pattern, self.s.log_text()) and time.time() < deadline:
            time.sleep(0.05)
        self.assertRegex(self.s.log_text(), pattern)
        get_json(self.s, "/v1/models/nope", self.auth)
        time.sleep(0.2)
        self.assertRegex(self.s.log_text(), r"request - GET /v1/models/nope 404 total=")
        self.assertNotRegex(self.s.log_text(), r"request - GET /health")

    def test_throughput_line_while_busy(self):
        status, body, _ = post_json(self.s, "/v1/completions", {"prompt": "count", "max_tokens": 32,
                                                                "ignore_eos": True}, self.auth)
        self.assertEqual(status, 200, body)
        line = r"throughput: prompt \d+\.\d tok/s, generation (\d+\.\d) tok/s, running \d+, waiting \d+, KV cache \d+\.\d% used"
        deadline = time.time() + 5
        while not re.search(line, self.s.log_text()) and time.time() < deadline:
            time.sleep(0.05)
        rates = [float(g) for g in re.findall(line, self.s.log_text())]
        self.assertTrue(any(r > 0 for r in rates), self.s.log_text())
        # Idle: no more lines (after a second for the last busy interval's line to come out).
        time.sleep(1.0)
        n = len(re.findall(line, self.s.log_text()))
        time.sleep(0.6)
        self.assertEqual(len(re.findall(line, self.s.log_text())), n)


class DefaultsTest(unittest.TestCase):
    def test_no_key_no_cors_by_default_and_env_key(self):
        s = Server("--disable-log-requests")
        try:
            status, body, hdrs = get_json(s, "/v1/models", {"Origin": ORIGIN})
            self.assertEqual(status, 200)
            self.assertNotIn("Access-Control-Allow-Origin", hdrs)
            status, _, _ = s.request("OPTIONS", "/v1/models", headers={"Origin": ORIGIN,
                                                                       "Access-Control-Request-Method": "GET"})
            self.assertEqual(status, 400)
            status, body, _ = post_json(s, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
            self.assertEqual(status, 200)
            time.sleep(0.2)
            self.assertNotIn("request cmpl-", s.log_text())
        finally:
            self.assertEqual(s.stop(), 0)
        s = Server(env={"TETRA_API_KEY": KEY})
        try:
            self.assertEqual(s.request("GET", "/v1/models")[0], 401)
            self.assertEqual(s.request("GET", "/v1/models", headers={"Authorization": "Bearer " + KEY})[0], 200)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_log_level_warning_silences_access_and_throughput_lines(self):
        s = Server("--log-level", "warning", "--log-stats-interval", "0.1")
        try:
            status, body, _ = post_json(s, "/v1/completions", {"prompt": "hi", "max_tokens": 8, "ignore_eos": True})
            self.assertEqual(status, 200)
            time.sleep(0.4)
            self.assertNotIn("request cmpl-", s.log_text())
            self.assertNotIn("throughput:", s.log_text())
        finally:
            self.assertEqual(s.stop(), 0)

    def test_bad_flags_are_one_sentence(self):
        r = subprocess.run([TETRA, "serve", "--model", MODEL, "--log-level", "loud"], capture_output=True, text=True,
                           timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--log-level", r.stderr)
        for flags in [["--allowed-origins", "[1,2]"], ["--allowed-origins", "a,,b"], ["--api-key", ""]]:
            r = subprocess.run([TETRA, "serve", "--model", MODEL, "--port", "0", *flags], capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn(flags[0], r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_version(self):
        r = subprocess.run([TETRA, "--version"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"^tetra \d+\.\d+\.\d+( \(commit [0-9a-f]+\))?\n$")


if __name__ == "__main__":
    unittest.main()
