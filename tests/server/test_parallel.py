"""`tetra serve --tp/--ep` on the CPU: the ranks serve the tokens and log-probs one rank serves,
a rank that fails mid-step (TETRA_TESTING_FAIL_RANK) makes the server answer the error, drain
and exit with status 1 instead of hanging, and pairs tetra cannot run are refused before it
listens."""
import os
import subprocess
import unittest

from harness import MODEL, TETRA, Server
from test_faults import wait_unhealthy_then_exit

CPU = ("--device", "cpu", "--kv-memory", "32M")  # a small pool: each rank zeroes its own
PROMPTS = ["def main():", "The quick brown fox", "1, 2, 3,", "Hello"]


@unittest.skipIf("cuda" in os.environ.get("TETRA_SERVE_FLAGS", ""), "--tp and --ep run on the CPU only so far")
class Ranks(unittest.TestCase):
    def completions(self, s):
        out = []
        for p in PROMPTS:
            status, body, _ = s.complete(prompt=p, max_tokens=10, temperature=0, logprobs=1, ignore_eos=True)
            self.assertEqual(status, 200, body)
            c = body["choices"][0]
            out.append((c["text"], c["logprobs"]["token_logprobs"]))
        return out

    def test_ranks_serve_what_one_rank_serves(self):
        one = Server(*CPU)
        try:
            want = self.completions(one)
        finally:
            self.assertEqual(one.stop(), 0)
        for flags in (("--tp", "2"), ("--ep", "2"), ("--tp", "2", "--ep", "2")):
            s = Server(*CPU, *flags)
            try:
                got = self.completions(s)
                self.assertIn("2 ranks", s.log_text())
            finally:
                self.assertEqual(s.stop(), 0)
            for (text_w, lp_w), (text_g, lp_g) in zip(want, got):
                self.assertEqual(text_g, text_w, flags)
                self.assertEqual(len(lp_g), len(lp_w))
                for a, b in zip(lp_g, lp_w):
                    self.assertAlmostEqual(a, b, delta=1e-4, msg=str(flags))

    def test_a_rank_that_fails_makes_the_server_exit_1(self):
        s = Server(*CPU, "--tp", "2", "--ep", "2", env={"TETRA_TESTING_FAIL_STEP": "0", "TETRA_TESTING_FAIL_RANK": "1"})
        try:
            status, body, _ = s.complete(prompt="fault", max_tokens=8)
            self.assertEqual(status, 500, body)
            self.assertIn("injected fault on rank 1", body["error"]["message"])
            self.assertEqual(wait_unhealthy_then_exit(s), 1)
            self.assertIn("the engine failed a step", s.log_text())
        finally:
            s.stop()

    def test_pairs_tetra_cannot_run_are_refused_before_listening(self):
        for flags, message in ((["--tp", "2", "--ep", "4"], "--ep 4 must divide --tp 2"),
                               (["--tp", "2", "--ep", "3"], "--ep 3 must divide --tp 2")):
            p = subprocess.run([TETRA, "serve", "--model", MODEL, "--port", "0", *CPU, *flags], capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn(message, p.stderr)
            self.assertNotIn("listening", p.stderr)
        p = subprocess.run([TETRA, "serve", "--model", MODEL, "--port", "0", *CPU, "--tp", "2"], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "TETRA_TESTING_FAIL_RANK": "2"})
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("TETRA_TESTING_FAIL_RANK must be a rank in [0, 2)", p.stderr)


if __name__ == "__main__":
    unittest.main()
