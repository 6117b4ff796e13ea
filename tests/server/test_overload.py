"""RELIABILITY.md cases 19, 20 and 21: queue overflow, KV exhaustion with preemption,
infeasible requests."""
import threading
import time
import unittest

from harness import Server, assert_error, assert_same_greedy, completion_tokens


def run_concurrently(fn, n):
    out = [None] * n

    def call(i):
        out[i] = fn(i)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return out


class OverloadTest(unittest.TestCase):
    # 19
    def test_19_queue_overflow_429(self):
        s = Server("--max-running-requests", "2", "--max-queued-requests", "4")
        try:
            rss0 = s.rss_kb()
            cap = 2 + 4
            results = run_concurrently(
                lambda i: s.complete(prompt="req %d" % i, max_tokens=30, ignore_eos=True), 10 * cap)
            statuses = [r[0] for r in results]
            self.assertEqual(set(statuses) - {200, 429}, set(), statuses)
            self.assertGreater(statuses.count(429), 0)
            self.assertGreaterEqual(statuses.count(200), cap)
            for st, body, headers in results:
                if st == 429:
                    assert_error(self, st, body, 429)
                    self.assertEqual(headers.get("Retry-After"), "1")
                else:
                    self.assertEqual(body["usage"]["completion_tokens"], 30)
                    self.assertEqual(body["choices"][0]["finish_reason"], "length")
            # While saturated, health, models and metrics still answer.
            m = s.wait_idle()
            self.assertEqual(m['tetra_kv_blocks{state="used"}'], 0)
            self.assertLess(s.rss_kb() - rss0, 64 * 1024)
        finally:
            self.assertEqual(s.stop(), 0)

    # 20
    def test_20_kv_exhaustion_preempts_with_identical_output(self):
        prompts = ["preempt me %d, then continue the story" % i for i in range(8)]
        req = {"max_tokens": 100, "temperature": 0, "ignore_eos": True, "logprobs": 5}
        big = Server("--max-running-requests", "8")
        try:
            reference = [big.complete(prompt=p, **req)[1]["choices"][0] for p in prompts]
        finally:
            big.stop()
        # About 24 blocks of 16 tokens: 8 sequences of ~110 tokens need 56.
        small = Server("--max-running-requests", "8", "--kv-memory", "440K")
        try:
            m0 = small.metrics()
            total = m0['tetra_kv_blocks{state="total"}']
            self.assertLess(total, 8 * 7, "the KV pool is too large to force preemption")
            results = run_concurrently(lambda i: small.complete(prompt=prompts[i], **req), len(prompts))
            for i, (st, body, _) in enumerate(results):
                self.assertEqual(st, 200, body)
                got, want = body["choices"][0], reference[i]
                assert_same_greedy(self, (got["text"], completion_tokens(got)),
                                   (want["text"], completion_tokens(want)), i)
                self.assertEqual(body["choices"][0]["finish_reason"], "length")
            m = small.wait_idle()
            self.assertGreater(m["tetra_preemptions_total"], 0)
            self.assertEqual(m['tetra_kv_blocks{state="used"}'], 0)
        finally:
            self.assertEqual(small.stop(), 0)

    # 21
    def test_21_infeasible_request_fails_fast(self):
        s = Server("--kv-memory", "200K")
        try:
            total = s.metrics()['tetra_kv_blocks{state="total"}']
            t0 = time.time()
            st, body, _ = s.complete(prompt=[5] * 40, max_tokens=int(total * 16 + 64), ignore_eos=True)
            self.assertLess(time.time() - t0, 60)
            if st == 200:
                self.assertEqual(body["choices"][0]["finish_reason"], "length")
            else:
                assert_error(self, st, body, 400)
            self.assertEqual(s.request("GET", "/health")[0], 200)
            self.assertEqual(s.complete(prompt="still alive", max_tokens=2)[0], 200)
            self.assertEqual(s.wait_idle()['tetra_kv_blocks{state="used"}'], 0)
        finally:
            self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    unittest.main()
