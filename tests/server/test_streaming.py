"""RELIABILITY.md cases 17, 18, 22, 23 and 24: disconnects free everything, determinism, stop
strings across token boundaries, SSE conformance."""
import http.client
import json
import threading
import time
import unittest

from harness import (Server, assert_same_greedy, completion_tokens, parse_sse, stream_chunks, stream_finish,
                     stream_text, stream_tokens)


def read_events(resp, want):
    """Reads SSE events from an open response until `want` events arrived."""
    buf = b""
    events = []
    while len(events) < want:
        data = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
        if not data:
            break
        buf += data
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            events.append(ev)
    return events


class StreamingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.s = Server("--max-running-requests", "64", "--http-threads", "2")

    @classmethod
    def tearDownClass(cls):
        assert cls.s.stop() == 0, cls.s.log_text()

    # 17
    def test_17_disconnect_mid_stream_frees_blocks(self):
        n = 64
        results = [None] * n
        prompts = ["story number %d begins:" % i for i in range(n)]

        def client(i):
            conn = http.client.HTTPConnection("127.0.0.1", self.s.port, timeout=120)
            # A leaving client asks for many tokens: on a GPU 40 of them can all be sent before it
            # closes, and then nothing was cut off.
            body = {"prompt": prompts[i], "max_tokens": 400 if i % 3 == 0 else 40, "ignore_eos": True,
                    "stream": True, "temperature": 0, "logprobs": 5}
            conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            r = conn.getresponse()
            if i % 3 == 0:
                read_events(r, 3)  # a few tokens, then vanish
                conn.sock.shutdown(2)
                conn.close()
                results[i] = "left"
                return
            raw = r.read()
            conn.close()
            chunks = stream_chunks(parse_sse(raw))
            results[i] = (stream_text(chunks), stream_finish(chunks), stream_tokens(chunks))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        t_end = time.time()
        m = self.s.wait_idle(timeout=1.0)
        self.assertLess(time.time() - t_end, 1.5)
        self.assertEqual(m["tetra_num_requests_running"], 0)
        self.assertEqual(m["tetra_num_requests_waiting"], 0)
        self.assertEqual(m['tetra_kv_blocks{state="used"}'], 0)
        self.assertGreater(m['tetra_kv_blocks{state="free"}'], 0)
        self.assertGreaterEqual(m.get("tetra_client_disconnects_total", 0), 1)
        for i, r in enumerate(results):
            if i % 3 == 0:
                self.assertEqual(r, "left")
            else:
                self.assertIsNotNone(r, i)
                self.assertEqual(r[1], "length")
        # The survivors' greedy text equals the same prompt alone (batch size 1).
        for i in (1, 2, 31):
            st, b, _ = self.s.complete(prompt=prompts[i], max_tokens=40, ignore_eos=True, temperature=0, logprobs=5)
            alone = b["choices"][0]
            assert_same_greedy(self, (results[i][0], results[i][2]), (alone["text"], completion_tokens(alone)), i)

    # 18
    def test_18_disconnect_while_queued(self):
        s = Server("--max-running-requests", "1")
        try:
            long = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
            long.request("POST", "/v1/completions", json.dumps(
                {"prompt": "x", "max_tokens": 400, "ignore_eos": True, "stream": True}),
                {"Content-Type": "application/json"})
            r_long = long.getresponse()
            read_events(r_long, 1)
            queued = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
            queued.request("POST", "/v1/completions", json.dumps(
                {"prompt": "y", "max_tokens": 400, "ignore_eos": True, "stream": True}),
                {"Content-Type": "application/json"})
            r_q = queued.getresponse()
            deadline = time.time() + 5
            while s.metrics()["tetra_num_requests_waiting"] < 1 and time.time() < deadline:
                time.sleep(0.02)
            self.assertEqual(s.metrics()["tetra_num_requests_waiting"], 1)
            queued.sock.shutdown(2)
            queued.close()
            deadline = time.time() + 1.0
            while s.metrics()["tetra_num_requests_waiting"] != 0 and time.time() < deadline:
                time.sleep(0.02)
            self.assertEqual(s.metrics()["tetra_num_requests_waiting"], 0)
            long.sock.shutdown(2)
            long.close()
            m = s.wait_idle(2.0)
            self.assertEqual(m['tetra_kv_blocks{state="used"}'], 0)
            self.assertEqual(m["tetra_num_requests_running"], 0)
        finally:
            self.assertEqual(s.stop(), 0)

    # 22
    def test_22_determinism(self):
        texts = set()
        for _ in range(4):
            st, b, _ = self.s.complete(prompt="The weather", max_tokens=24, temperature=0.8, seed=1234,
                                       ignore_eos=True)
            self.assertEqual(st, 200)
            texts.add(b["choices"][0]["text"])
        self.assertEqual(len(texts), 1, texts)
        st, b, _ = self.s.complete(prompt="The weather", max_tokens=24, temperature=0.8, seed=99, ignore_eos=True)
        # n choices use seeds seed, seed+1, ...: choice 1 of seed 1233 is choice 0 of seed 1234.
        st, b2, _ = self.s.complete(prompt="The weather", max_tokens=24, temperature=0.8, seed=1233, n=2,
                                    ignore_eos=True)
        self.assertEqual(b2["choices"][1]["text"], texts.pop())
        # Streaming and non-streaming give the same text (greedy and seeded).
        for fields in ({"temperature": 0}, {"temperature": 0.9, "seed": 7}):
            req = {"prompt": "Once upon", "max_tokens": 30, "ignore_eos": True, **fields}
            st, b, _ = self.s.complete(**req)
            st2, events, _ = self.s.stream("/v1/completions", {**req, "stream": True})
            chunks = stream_chunks(events)
            self.assertEqual(stream_text(chunks), b["choices"][0]["text"])
            self.assertEqual(stream_finish(chunks), b["choices"][0]["finish_reason"])
        # Greedy alone equals greedy inside a batch of 64.
        alone = self.s.complete(prompt="needle", max_tokens=20, temperature=0, ignore_eos=True)[1]
        out = [None] * 64

        def client(i):
            p = "needle" if i == 17 else "hay %d" % i
            out[i] = self.s.complete(prompt=p, max_tokens=20, temperature=0, ignore_eos=True)[1]

        threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(out[17]["choices"][0]["text"], alone["choices"][0]["text"])

    # 23
    def test_23_stop_strings(self):
        base = {"prompt": "A long time ago", "max_tokens": 60, "temperature": 0, "ignore_eos": True}
        full = self.s.complete(**base)[1]["choices"][0]["text"]
        self.assertGreater(len(full), 12, full)
        # Greedy tokens of the full text, to find a stop string spanning two tokens.
        lp = self.s.complete(**base, logprobs=0)[1]["choices"][0]["logprobs"]
        offsets, tokens = lp["text_offset"], lp["tokens"]
        stops = []
        for k in range(2, len(offsets) - 1):
            if offsets[k + 1] - offsets[k] >= 1 and offsets[k] - offsets[k - 1] >= 1:
                a, c = offsets[k] - 1, offsets[k] + 1  # last byte of one token + first of the next
                cand = full.encode()[a:c]
                try:
                    stops.append(cand.decode())
                except UnicodeDecodeError:
                    continue
                break
        multibyte = [ch for ch in full if len(ch.encode()) > 1 and ch != "\ufffd"]
        if multibyte:
            stops.append(multibyte[0])
        stops.append(full[len(full) // 2: len(full) // 2 + 3])
        self.assertTrue(stops)
        for stop in stops:
            if not stop:
                continue
            want = full[: full.index(stop)]
            st, b, _ = self.s.complete(**base, stop=[stop, "zzzzqqqq"])
            self.assertEqual(st, 200)
            self.assertEqual(b["choices"][0]["text"], want, stop)
            self.assertEqual(b["choices"][0]["finish_reason"], "stop")
            st, events, _ = self.s.stream("/v1/completions", {**base, "stop": stop, "stream": True})
            chunks = stream_chunks(events)  # parse_sse decoded the body strictly as UTF-8
            self.assertEqual(stream_text(chunks), want)
            self.assertEqual(stream_finish(chunks), "stop")
            for c in chunks:  # no event carries a fragment of the stop string past the cut
                self.assertNotIn(stop, c["choices"][0]["text"])

    # 24
    def test_24_sse_conformance(self):
        req = {"prompt": "Hello", "max_tokens": 12, "ignore_eos": True, "temperature": 0}
        ref = self.s.complete(**req)[1]
        for path, body in [("/v1/completions", req),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}],
                                                     "max_tokens": 12, "ignore_eos": True, "temperature": 0})]:
            st, events, raw = self.s.stream(path, {**body, "stream": True,
                                                   "stream_options": {"include_usage": True}})
            self.assertEqual(st, 200)
            chunks = stream_chunks(events)
            usage_chunks = [c for c in chunks if c.get("usage")]
            self.assertEqual(len(usage_chunks), 1)
            self.assertIs(chunks[-1], usage_chunks[0])
            self.assertEqual(chunks[-1]["choices"], [])
            u = chunks[-1]["usage"]
            self.assertEqual(u["completion_tokens"], 12)
            self.assertEqual(u["total_tokens"], u["prompt_tokens"] + 12)
            for c in chunks[:-1]:
                self.assertIsNone(c["usage"])
                self.assertEqual(len(c["choices"]), 1)
            if path == "/v1/completions":
                self.assertEqual(u["prompt_tokens"], ref["usage"]["prompt_tokens"])
                self.assertEqual(stream_text(chunks), ref["choices"][0]["text"])
                self.assertTrue(all(c["object"] == "text_completion" for c in chunks))
            else:
                self.assertEqual(chunks[0]["choices"][0]["delta"]["role"], "assistant")
                self.assertTrue(all(c["object"] == "chat.completion.chunk" for c in chunks))
        # Without include_usage: no usage anywhere, still ends with [DONE].
        st, events, _ = self.s.stream("/v1/completions", {**req, "stream": True})
        chunks = stream_chunks(events)
        self.assertTrue(all("usage" not in c for c in chunks))
        # n=2 streams both choices, each finishing once.
        st, events, _ = self.s.stream("/v1/completions", {**req, "n": 2, "stream": True})
        chunks = stream_chunks(events)
        self.assertEqual(stream_finish(chunks, 0), "length")
        self.assertEqual(stream_finish(chunks, 1), "length")


if __name__ == "__main__":
    unittest.main()
