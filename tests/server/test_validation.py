"""RELIABILITY.md cases 1-16: hostile and malformed requests get a 4xx with OpenAI's error
object, the server stays up, /health stays 200 and no KV block leaks."""
import json
import os
import socket
import subprocess
import tempfile
import time
import unittest

from harness import MODEL, TETRA, Server, assert_error

CONTEXT = 64


class ValidationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Server("--context-length", str(CONTEXT), "--read-timeout", "2")
        cls.vocab = json.loads(cls.s.request("GET", "/v1/models")[2])["data"][0]["vocab_size"]

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0, cls.s.log_text()

    def tearDown(self):
        status, _, _ = self.s.request("GET", "/health")
        self.assertEqual(status, 200)
        m = self.s.wait_idle()
        self.assertEqual(m['tetra_kv_blocks{state="used"}'], 0)

    def bad(self, fields, param, status=400):
        body = {"prompt": "hello", "max_tokens": 2}
        body.update(fields)
        st, b, _ = self.s.complete(**body)
        assert_error(self, st, b, status, param)
        return b

    def ok(self, **fields):
        body = {"prompt": "hello", "max_tokens": 2}
        body.update(fields)
        st, b, _ = self.s.complete(**body)
        self.assertEqual(st, 200, b)
        return b

    # 1
    def test_01_empty_and_non_object_bodies(self):
        for raw in [b"", b"42", b"[]", b'"x"', b"null", b'{"prompt": "a"', b"{", b"\xff\xfe"]:
            st, b, _ = self.s.post("/v1/completions", raw)
            assert_error(self, st, b, 400)
            self.assertEqual(b["error"]["type"], "invalid_request_error")
        st, b, _ = self.s.post("/v1/chat/completions", b"[1,2]")
        assert_error(self, st, b, 400)

    # 2
    def test_02_wrong_types_name_the_field(self):
        self.bad({"max_tokens": "10"}, "max_tokens")
        self.bad({"stop": 123}, "stop")
        self.bad({"temperature": "hot"}, "temperature")
        self.bad({"stream": "yes"}, "stream")
        self.bad({"prompt": {"a": 1}}, "prompt")
        st, b, _ = self.s.post("/v1/chat/completions", {"messages": {}})
        assert_error(self, st, b, 400, "messages")
        st, b, _ = self.s.post("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]})
        assert_error(self, st, b, 400, "messages[0].role")

    # 3
    def test_03_content_type(self):
        st, _, data = self.s.request("POST", "/v1/completions", json.dumps({"prompt": "a"}),
                                     {"Content-Type": "text/plain"})
        b = json.loads(data)
        self.assertIn(st, (400, 415))
        self.assertIn("error", b)

    # 4
    def test_04_huge_body_and_headers(self):
        rss0 = self.s.rss_kb()
        # 9 MB announced, 1 KB sent: the answer comes without the server reading the rest.
        with socket.create_connection(("127.0.0.1", self.s.port), timeout=10) as c:
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 9437184\r\n\r\n" + b" " * 1024)
            resp = c.recv(65536).decode(errors="replace")
        self.assertTrue(resp.startswith("HTTP/1.1 413"), resp[:200])
        self.assertIn('"error"', resp)
        # The same with chunked transfer (no length known in advance): 12 MB sent, 413 read back.
        with socket.create_connection(("127.0.0.1", self.s.port), timeout=20) as c:
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n")
            chunk = b"%x\r\n" % (1 << 20) + b" " * (1 << 20) + b"\r\n"
            for _ in range(12):
                try:
                    c.sendall(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    break
            resp = c.recv(65536)
            self.assertTrue(resp.startswith(b"HTTP/1.1 413"), resp[:200])
        # One 64 KB header, then 10,000 small headers.
        for headers in [b"X-Big: " + b"a" * 65536 + b"\r\n",
                        b"".join(b"X-H%d: v\r\n" % i for i in range(10000))]:
            with socket.create_connection(("127.0.0.1", self.s.port), timeout=10) as c:
                try:
                    c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                resp = c.recv(65536).decode(errors="replace")
            self.assertTrue(resp.startswith("HTTP/1.1 431") or resp.startswith("HTTP/1.1 400"), resp[:200])
        rss1 = self.s.rss_kb()
        self.assertLess(rss1 - rss0, 64 * 1024, (rss0, rss1))  # flat: well under the 9 MB body

    # 5
    def test_05_slowloris(self):
        c = socket.create_connection(("127.0.0.1", self.s.port), timeout=10)
        start = time.time()
        closed_after = None
        for byte in b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" * 4:
            try:
                c.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.time() - start
                break
            # Other clients are served meanwhile.
            if time.time() - start < 1.0:
                t0 = time.time()
                self.assertEqual(self.s.request("GET", "/health")[0], 200)
                self.assertLess(time.time() - t0, 0.5)
            time.sleep(0.2)
            c.setblocking(False)
            try:
                if c.recv(1) == b"":
                    closed_after = time.time() - start
                    break
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed_after = time.time() - start
                break
            finally:
                c.setblocking(True)
        c.close()
        self.assertIsNotNone(closed_after, "the dribbling connection was never closed")
        self.assertLess(closed_after, 4.0)  # --read-timeout 2

    # 6
    def test_06_unknown_and_unsupported_fields(self):
        self.ok(user="u1", metadata={"a": "b"}, foo=[1, 2])
        self.bad({"best_of": 2}, "best_of")
        self.bad({"suffix": "tail"}, "suffix")
        self.bad({"echo": True}, "echo")
        self.ok(best_of=1, echo=False)

    # 7
    def test_07_temperature(self):
        self.bad({"temperature": -1}, "temperature")
        self.bad({"temperature": 2.5}, "temperature")
        st, b, _ = self.s.post("/v1/completions", b'{"prompt": "a", "temperature": NaN}')
        assert_error(self, st, b, 400)
        st, b, _ = self.s.post("/v1/completions", b'{"prompt": "a", "temperature": 1e999}')
        assert_error(self, st, b, 400)
        a = self.ok(temperature=0, max_tokens=6)
        b = self.ok(temperature=0, max_tokens=6)
        self.assertEqual(a["choices"][0]["text"], b["choices"][0]["text"])  # 0 = greedy
        self.ok(temperature=2)

    # 8
    def test_08_top_p(self):
        self.bad({"top_p": 0}, "top_p")
        self.bad({"top_p": 1.5}, "top_p")
        self.bad({"top_p": -0.1}, "top_p")
        self.ok(top_p=1.0, temperature=1.0)
        self.ok(top_p=1e-6, temperature=1.0)

    # 9
    def test_09_max_tokens(self):
        for field in ("max_tokens", "max_completion_tokens"):
            for v in (0, -5, 2 ** 63, 2 ** 64 + 1, 1.5):
                self.bad({field: v}, field)
        # Both given: the smaller one wins.
        b = self.ok(max_tokens=5, max_completion_tokens=3, ignore_eos=True)
        self.assertEqual(b["usage"]["completion_tokens"], 3)
        b = self.ok(max_tokens=2, max_completion_tokens=4, ignore_eos=True)
        self.assertEqual(b["usage"]["completion_tokens"], 2)

    # 10
    def test_10_context_length(self):
        b = self.ok(prompt=[1] * (CONTEXT - 1), max_tokens=1, ignore_eos=True)
        self.assertEqual(b["usage"]["prompt_tokens"], CONTEXT - 1)
        self.assertEqual(b["usage"]["completion_tokens"], 1)
        e = self.bad({"prompt": [1] * CONTEXT, "max_tokens": 1}, "prompt")
        self.assertEqual(e["error"]["code"], "context_length_exceeded")
        self.assertIn(str(CONTEXT), e["error"]["message"])
        e = self.bad({"prompt": [1] * 10, "max_tokens": CONTEXT}, "max_tokens")
        self.assertEqual(e["error"]["code"], "context_length_exceeded")
        self.assertIn("10 input tokens", e["error"]["message"])

    # 11
    def test_11_n_logprobs_stop_bounds(self):
        for n in (0, 10 ** 9, -1):
            self.bad({"n": n}, "n")
        self.bad({"logprobs": 21}, "logprobs")
        self.bad({"logprobs": -1}, "logprobs")
        st, b, _ = self.s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                        "logprobs": True, "top_logprobs": 21})
        assert_error(self, st, b, 400, "top_logprobs")
        self.bad({"stop": ["s%d" % i for i in range(17)]}, "stop")
        self.bad({"stop": ""}, "stop")
        self.bad({"stop": ["a", ""]}, "stop")
        self.bad({"stop": "x" * 1000}, "stop")
        b = self.ok(n=3, max_tokens=2)
        self.assertEqual([c["index"] for c in b["choices"]], [0, 1, 2])

    # 12
    def test_12_integer_extremes(self):
        self.ok(seed=-1)
        self.ok(seed=2 ** 64 - 1)
        self.bad({"seed": 2 ** 70}, "seed")
        self.bad({"seed": "1"}, "seed")
        self.bad({"top_k": -2}, "top_k")
        self.bad({"top_k": 2 ** 40}, "top_k")
        self.ok(top_k=-1)
        self.ok(top_k=1, temperature=1.0)
        for field in ("presence_penalty", "frequency_penalty"):
            self.bad({field: 2.5}, field)
            self.bad({field: -3}, field)
        self.ok(presence_penalty=1.5, frequency_penalty=-1.5)
        # vLLM's repetition_penalty: above 0 with no upper bound, here up to the float's largest.
        for bad in (0, -1, 1e39, 1e-50, "2", True):
            self.bad({"repetition_penalty": bad}, "repetition_penalty")
        self.ok(repetition_penalty=1.3)
        self.ok(repetition_penalty=0.5, presence_penalty=0.5)
        self.ok(repetition_penalty=1e30, temperature=0)
        self.ok(repetition_penalty=None)
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        st, b, _ = self.s.post("/v1/chat/completions", {**chat, "repetition_penalty": 0})
        assert_error(self, st, b, 400, "repetition_penalty")
        st, b, _ = self.s.post("/v1/chat/completions", {**chat, "repetition_penalty": 1.2})
        self.assertEqual(st, 200, b)
        self.bad({"logit_bias": {"1": 1e9}}, "logit_bias")
        self.bad({"logit_bias": {"1": -101}}, "logit_bias")

    # 13
    def test_13_token_ids_and_logit_bias_keys(self):
        self.bad({"prompt": [1, -1, 2]}, "prompt")
        self.bad({"prompt": [self.vocab]}, "prompt")
        self.bad({"prompt": [2 ** 64]}, "prompt")
        self.bad({"prompt": [1.5]}, "prompt")
        self.bad({"prompt": [[1, 2], [3]]}, "prompt")
        self.ok(prompt=[self.vocab - 1])
        self.ok(prompt=[[3, 4, 5]])
        self.bad({"logit_bias": {"abc": 1}}, "logit_bias")
        self.bad({"logit_bias": {str(self.vocab): 1}}, "logit_bias")
        self.bad({"logit_bias": {"-1": 1}}, "logit_bias")

    # 14
    def test_14_tokenizer_stress(self):
        cases = ["A" * 200_000, "\u00e9" * 100_000, ("\U0001F600\u4e2d\u6587" * 100_000)[:300_000]]
        for text in cases:
            t0 = time.time()
            st, b, _ = self.s.complete(prompt=text, max_tokens=1)
            elapsed = time.time() - t0
            self.assertLess(elapsed, 2.0 * max(1, len(text.encode()) / 1e6) + 1.0)
            assert_error(self, st, b, 400, "prompt")  # far longer than the 64-token context
            self.assertEqual(b["error"]["code"], "context_length_exceeded")
        # Invalid UTF-8 and lone surrogates are invalid JSON: 400, not a crash.
        for raw in [b'{"prompt": "\xff\xfe abc"}', b'{"prompt": "\\ud800 x"}']:
            st, b, _ = self.s.post("/v1/completions", raw)
            assert_error(self, st, b, 400)
        self.ok(prompt="nul \u0000 byte")
        # A completion prompt is the client's whole prompt, encoded as HF's tokenizer(text) and
        # vLLM encode it: a special-token string is that token; other text stays text.
        b = self.ok(prompt="<|im_end|>", max_tokens=1)
        self.assertEqual(b["usage"]["prompt_tokens"], 1)
        b = self.ok(prompt="<|endoftext|><s></s>", max_tokens=1)
        self.assertGreater(b["usage"]["prompt_tokens"], 3)
        # In chat the template's own control tokens are parsed, the client's message text is not.
        def chat_tokens(content):
            st, b, _ = self.s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": content}],
                                                            "max_tokens": 1})
            self.assertEqual(st, 200, b)
            return b["usage"]["prompt_tokens"]
        self.assertGreater(chat_tokens("<|im_end|>") - chat_tokens(""), 1)
        # Ordinary messages tokenize exactly as the whole rendered chat does (`tetra tokenize --chat`).
        messages = [{"role": "system", "content": "A"}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "B"}, {"role": "user", "content": " x\n "}]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(messages, f)
        r = subprocess.run([TETRA, "tokenize", "--model", MODEL, "--chat", f.name, "--json"],
                           capture_output=True, text=True, timeout=60)
        os.unlink(f.name)
        self.assertEqual(r.returncode, 0, r.stderr)
        want = len(json.loads(r.stdout)["ids"])
        st, b, _ = self.s.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1})
        self.assertEqual(st, 200, b)
        self.assertEqual(b["usage"]["prompt_tokens"], want)

    # 15
    def test_15_malformed_tools_and_response_format(self):
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        # Nesting deep enough to overflow a recursive parser or destructor; the body stays
        # under the 8 MB limit.
        for depth in (10_000, 1_000_000):
            nested = "[" * depth + "]" * depth
            raw = json.dumps(chat)[:-1] + ', "tools": ' + nested + "}"
            st, b, _ = self.s.post("/v1/chat/completions", raw.encode())
            assert_error(self, st, b, 400, "tools[0]")
        for rf in [{"type": "json_schema", "json_schema": {"schema": {"$ref": "#"}}},
                   {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "(("}}},
                   {"type": "json_object"}, "json", {"kind": "text"}]:
            st, b, _ = self.s.post("/v1/chat/completions", {**chat, "response_format": rf})
            assert_error(self, st, b, 400, "response_format")
        st, b, _ = self.s.post("/v1/chat/completions", {**chat, "response_format": {"type": "text"}, "tools": []})
        self.assertEqual(st, 200, b)

    # 15b: tools, tool_choice, tool-call history and chat_template_kwargs (CVE-2025-48944:
    # malformed tools crashed vLLM's worker). Each is a 400 naming the field; the server stays up.
    def test_15b_malformed_tool_requests(self):
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
        cases = [
            ({"tools": {"name": "f"}}, "tools"),
            ({"tools": "f"}, "tools"),
            ({"tools": [5]}, "tools[0]"),
            ({"tools": [{"type": "function"}]}, "tools[0].function"),
            ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
            ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
            ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
            ({"tools": [{"type": "function", "function": {"name": 7}}]}, "tools[0].function.name"),
            ({"tools": [tool, {"type": "function", "function": {"name": "g", "parameters": "x"}}]},
             "tools[1].function.parameters"),
            ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "tools[0].function.parameters"),
            ({"tools": [tool] * 129}, "tools"),
            ({"tools": [tool], "tool_choice": "sometimes"}, "tool_choice"),
            ({"tools": [tool], "tool_choice": 3}, "tool_choice"),
            ({"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
            ({"tools": [tool], "tool_choice": {"type": "function"}}, "tool_choice"),
            ({"tool_choice": "required"}, "tool_choice"),
            ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
            ({"tools": [tool], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
            ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
            ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ]
        for fields, param in cases:
            st, b, _ = self.s.post("/v1/chat/completions", {**chat, **fields})
            assert_error(self, st, b, 400, param)
        # Nested 100,000 deep where a schema or arguments go: copying or rendering such a value
        # recursed once per level and overflowed the stack (the server died).
        deep = '{"a":' * 100_000 + "1" + "}" * 100_000
        prefix = json.dumps(chat)[:-1]
        for raw, param in [
            (prefix + ', "tools": [{"type": "function", "function": {"name": "f", "parameters": %s}}]}' % deep, "tools[0]"),
            (prefix + ', "chat_template_kwargs": %s}' % deep, "chat_template_kwargs"),
            ('{"max_tokens": 2, "messages": [{"role": "assistant", "content": null, "tool_calls": [{"type": "function", '
             '"function": {"name": "f", "arguments": %s}}]}, {"role": "user", "content": "hi"}]}' % json.dumps(deep),
             "messages[0].tool_calls[0].function.arguments"),
        ]:
            st, b, _ = self.s.post("/v1/chat/completions", raw.encode())
            assert_error(self, st, b, 400, param)
        call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}
        history = [
            ([{"role": "assistant", "content": None, "tool_calls": {"x": 1}}], "messages[0].tool_calls"),
            ([{"role": "assistant", "content": None, "tool_calls": [5]}], "messages[0].tool_calls[0]"),
            ([{"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}],
             "messages[0].tool_calls[0].function"),
            ([{"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]}],
             "messages[0].tool_calls[0].function.name"),
            ([{"role": "assistant", "content": None,
               "tool_calls": [{**call, "function": {"name": "f", "arguments": "{not json"}}]}],
             "messages[0].tool_calls[0].function.arguments"),
            ([{"role": "assistant", "content": None,
               "tool_calls": [{**call, "function": {"name": "f", "arguments": "[1, 2]"}}]}],
             "messages[0].tool_calls[0].function.arguments"),
            ([{"role": "assistant", "content": None, "tool_calls": [{**call, "id": 5}]}], "messages[0].tool_calls[0].id"),
            ([{"role": "tool", "content": "r", "tool_call_id": 5}], "messages[0].tool_call_id"),
            ([{"role": "assistant", "content": "x", "reasoning_content": 5}], "messages[0].reasoning_content"),
            ([{"role": "assistant", "content": "x", "reasoning": [1]}], "messages[0].reasoning"),
        ]
        for messages, param in history:
            st, b, _ = self.s.post("/v1/chat/completions", {**chat, "messages": messages + chat["messages"]})
            assert_error(self, st, b, 400, param)
        # Well-formed, they are accepted (the fixture is qwen3_moe: the hermes parser by default).
        ok = {**chat, "max_tokens": 1, "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "f"}},
              "chat_template_kwargs": {"enable_thinking": False},
              "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                           {"role": "tool", "content": "1", "tool_call_id": "call_1"}]}
        for choice in ["auto", "none", "required", ok["tool_choice"], {"function": {"name": "f"}}]:
            st, b, _ = self.s.post("/v1/chat/completions", {**ok, "tool_choice": choice})
            self.assertEqual(st, 200, b)
        # `type` defaults to "function" (vLLM's default).
        st, b, _ = self.s.post("/v1/chat/completions", {**chat, "max_tokens": 1, "tools": [{"function": {"name": "f"}}]})
        self.assertEqual(st, 200, b)
        st, b, _ = self.s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2, "tools": [tool]})
        assert_error(self, st, b, 400, "tools")
        self.assertEqual(self.s.request("GET", "/health")[0], 200)

    # 16
    def test_16_request_chat_template_is_not_used(self):
        # Templates come from the model folder only: a client's template (here one that would
        # loop forever and read a file) is an ignored unknown field, and the render is the model's.
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
        hostile = "{% for i in range(10**9) %}{% include '/etc/passwd' %}{% endfor %}"
        st, plain, _ = self.s.post("/v1/chat/completions", chat)
        self.assertEqual(st, 200, plain)
        for field in ("chat_template", "chat_template_kwargs"):
            value = hostile if field == "chat_template" else {"template": hostile}
            st, b, _ = self.s.post("/v1/chat/completions", {**chat, field: value})
            self.assertEqual(st, 200, b)
            self.assertEqual(b["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"])
            self.assertEqual(b["choices"][0]["message"]["content"], plain["choices"][0]["message"]["content"])

    def test_routes_and_methods(self):
        st, _, data = self.s.request("GET", "/nope")
        self.assertEqual(st, 404)
        self.assertIn("error", json.loads(data))
        st, _, data = self.s.request("GET", "/v1/completions")
        self.assertEqual(st, 405)
        st, _, data = self.s.request("GET", "/v1/models")
        self.assertEqual(st, 200)
        self.assertEqual(json.loads(data)["object"], "list")


if __name__ == "__main__":
    unittest.main()
