"""Load: 2,048 concurrent streaming connections against a server with a 64-request batch, so
most of them wait in the queue. Bounded in time; nothing lost (every stream ends with its
tokens and data: [DONE]); RSS reported before, at peak and after."""
import asyncio
import json
import os
import time
import unittest

from harness import Server

CONNECTIONS = int(os.environ.get("TETRA_LOAD_CONNECTIONS", "2048"))
MAX_TOKENS = 16
TIME_LIMIT_S = 300


async def one_stream(port, i, opened, all_open, results):
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    opened.append(i)
    if len(opened) == CONNECTIONS:
        all_open.set()
    await all_open.wait()  # every connection is open before the first request goes out
    body = json.dumps({"prompt": [1 + i % 400, 2 + i % 300, 3], "max_tokens": MAX_TOKENS, "ignore_eos": True,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    raw = await reader.read()  # until the server closes (Connection: close)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    ok = head.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in body and \
        (b'"completion_tokens":%d' % MAX_TOKENS) in body
    results[i] = ok


async def run(port, sample):
    opened, results, all_open = [], [None] * CONNECTIONS, asyncio.Event()
    tasks = [asyncio.create_task(one_stream(port, i, opened, all_open, results)) for i in range(CONNECTIONS)]
    sampler = asyncio.create_task(sample())
    await asyncio.wait_for(asyncio.gather(*tasks), TIME_LIMIT_S)
    sampler.cancel()
    return results


class LoadTest(unittest.TestCase):
    def test_2048_concurrent_streams(self):
        s = Server("--max-running-requests", "64", "--max-queued-requests", str(CONNECTIONS + 64),
                   "--http-threads", "2")
        try:
            rss_before = s.rss_kb()
            peak = {"connections": 0, "waiting": 0, "rss": rss_before}

            async def sample():
                while True:
                    await asyncio.sleep(0.1)
                    m = await asyncio.to_thread(s.metrics)
                    peak["connections"] = max(peak["connections"], m.get("tetra_http_connections", 0))
                    peak["waiting"] = max(peak["waiting"], m.get("tetra_num_requests_waiting", 0))
                    peak["rss"] = max(peak["rss"], s.rss_kb())

            t0 = time.time()
            results = asyncio.run(run(s.port, sample))
            elapsed = time.time() - t0
            m = s.wait_idle()
            rss_after = s.rss_kb()
            lost = results.count(False) + results.count(None)
            print("\nload: %d concurrent streams in %.1f s, %d lost; peak %d connections held, %d waiting; "
                  "RSS %.1f MiB before, %.1f MiB peak, %.1f MiB after"
                  % (CONNECTIONS, elapsed, lost, peak["connections"], peak["waiting"],
                     rss_before / 1024, peak["rss"] / 1024, rss_after / 1024))
            self.assertEqual(lost, 0)
            self.assertLess(elapsed, TIME_LIMIT_S)
            self.assertGreaterEqual(peak["connections"], CONNECTIONS * 0.9)
            self.assertGreater(peak["waiting"], CONNECTIONS / 2)  # most of them queued
            self.assertEqual(m['tetra_kv_blocks{state="used"}'], 0)
            self.assertLess(rss_after - rss_before, 256 * 1024)
        finally:
            self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    unittest.main()
