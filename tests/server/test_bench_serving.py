"""`tetra bench serving` against `tetra serve` on the CPU, as a smoke test: every request
completes, the token counts add up, and --json holds the figures."""
import json
import os
import subprocess
import tempfile
import unittest

from harness import TETRA, Server


class BenchServingTest(unittest.TestCase):
    def run_bench(self, s, *flags, env=None):
        out = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
        r = subprocess.run([TETRA, "bench", "serving", "--url", "http://127.0.0.1:%d" % s.port, "--json", out,
                            *flags], capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        print("\n" + r.stdout)
        with open(out) as f:
            result = json.load(f)
        os.unlink(out)
        return r.stdout, result

    def test_bench_serving_smoke(self):
        s = Server("--max-running-requests", "16")
        try:
            stdout, j = self.run_bench(s, "--num-prompts", "32", "--random-input-len", "48",
                                       "--random-output-len", "16", "--random-range-ratio", "0.5",
                                       "--max-concurrency", "8")
            self.assertEqual(j["completed"], 32)
            self.assertEqual(j["failed"], 0)
            self.assertEqual(j["prompt_format"], "ids")
            self.assertGreaterEqual(j["total_output_tokens"], 32 * 8)
            self.assertLessEqual(j["total_output_tokens"], 32 * 16)
            self.assertGreaterEqual(j["total_input_tokens"], 32 * 24)
            for key in ("output_throughput", "total_throughput", "request_throughput", "mean_ttft_ms",
                        "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms"):
                self.assertGreater(j[key], 0, key)
            self.assertIn("Output token throughput (tok/s):", stdout)
            # Poisson arrivals and the text-prompt fallback.
            _, j = self.run_bench(s, "--num-prompts", "12", "--random-input-len", "16", "--random-output-len", "8",
                                  "--request-rate", "40", "--prompt-format", "text")
            self.assertEqual(j["completed"], 12)
            self.assertEqual(j["prompt_format"], "text")
        finally:
            self.assertEqual(s.stop(), 0)


    def test_bench_serving_sends_openai_api_key(self):
        s = Server("--api-key", "sk-bench")
        try:
            env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
            r = subprocess.run([TETRA, "bench", "serving", "--url", "http://127.0.0.1:%d" % s.port, "--num-prompts", "2",
                                "--random-input-len", "8", "--random-output-len", "4"],
                               capture_output=True, text=True, timeout=300, env=env)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("401", r.stderr)
            _, j = self.run_bench(s, "--num-prompts", "4", "--random-input-len", "8", "--random-output-len", "4",
                                  env={**env, "OPENAI_API_KEY": "sk-bench"})
            self.assertEqual((j["completed"], j["failed"]), (4, 0))
        finally:
            self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    unittest.main()
