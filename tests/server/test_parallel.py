"""`tetra serve --tp/--ep` on the CPU: the ranks serve the tokens and log-probs one rank serves,
a rank that fails mid-step (TETRA_TESTING_FAIL_RANK) makes the server answer the error, drain
and exit with status 1 instead of hanging, and pairs tetra cannot run are refused before it
listens. The same over several nodes (--nnodes, each a process here, joined over loopback): a
node lost or failing ends every node, node 0 draining and exiting 1."""
import os
import signal
import subprocess
import tempfile
import time
import unittest

from harness import MODEL, TETRA, Server, free_port
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


class OtherNode:
    """A node other than node 0: `tetra serve` with no HTTP, following node 0's steps."""

    def __init__(self, rank, *flags, env=None):
        self.log = tempfile.NamedTemporaryFile(prefix="tetra-node-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([TETRA, "serve", "--model", MODEL, "--port", "0", *flags, "--node-rank", str(rank)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def log_text(self):
        with open(self.log.name, "r", errors="replace") as f:
            return f.read()[-4000:]

    def wait(self, timeout=30):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("a node still runs %d s after node 0 went:\n%s" % (timeout, self.log_text()))


@unittest.skipIf("cuda" in os.environ.get("TETRA_SERVE_FLAGS", ""), "two GPU nodes need two GPUs of their own")
class Nodes(unittest.TestCase):
    def start(self, nnodes, *flags, env0=None, env_other=None, other_flags=()):
        """Node 0 (a Server) and the others, all with the same flags; returns (node 0, [others])."""
        group = (*CPU, *flags, "--nnodes", str(nnodes), "--dist-init-addr", "127.0.0.1:%d" % free_port())
        others = [OtherNode(k, *group, *other_flags, env=env_other) for k in range(1, nnodes)]
        try:
            zero = Server(*group, "--node-rank", "0", env=env0)
        except Exception:
            for o in others:
                o.proc.kill()
            raise
        return zero, others

    def test_nodes_serve_what_one_rank_serves_and_stop_with_node_0(self):
        one = Server(*CPU)
        try:
            want = Ranks.completions(self, one)
        finally:
            self.assertEqual(one.stop(), 0)
        for nnodes, flags in ((2, ("--tp", "2")), (2, ("--tp", "4", "--ep", "2")), (4, ("--ep", "4"))):
            zero, others = self.start(nnodes, *flags)
            try:
                got = Ranks.completions(self, zero)
                self.assertIn("all %d nodes joined" % nnodes, zero.log_text())
            finally:
                self.assertEqual(zero.stop(), 0)
            for o in others:
                self.assertEqual(o.wait(), 0, o.log_text())
                self.assertIn("node 0 stopped", o.log_text())
            for (text_w, lp_w), (text_g, lp_g) in zip(want, got):
                self.assertEqual(text_g, text_w, flags)
                for a, b in zip(lp_g, lp_w):
                    self.assertAlmostEqual(a, b, delta=1e-4, msg=str(flags))

    def test_a_lost_node_makes_node_0_drain_and_exit_1(self):
        zero, (other,) = self.start(2, "--tp", "2")
        try:
            status, body, _ = zero.complete(prompt="before", max_tokens=4)
            self.assertEqual(status, 200, body)
            other.proc.send_signal(signal.SIGKILL)
            other.proc.wait()
            deadline = time.time() + 10  # the loss shows once node 0 reads the closed link
            while zero.proc.poll() is None and time.time() < deadline:
                try:
                    if zero.request("GET", "/health", timeout=1)[0] != 200:
                        break
                except OSError:
                    break  # the listener closed on exit
                time.sleep(0.02)
            self.assertEqual(wait_unhealthy_then_exit(zero), 1)
            self.assertIn("node 1 (127.0.0.1:", zero.log_text())
            self.assertIn("was lost", zero.log_text())
        finally:
            zero.stop()

    def test_node_0_lost_makes_the_others_exit_1(self):
        zero, (other,) = self.start(2, "--tp", "2")
        try:
            zero.proc.send_signal(signal.SIGKILL)
            self.assertEqual(other.wait(), 1)
            self.assertIn("node 0 (127.0.0.1:", other.log_text())
        finally:
            zero.stop()

    def test_a_rank_failing_on_another_node_fails_the_step_everywhere(self):
        zero, (other,) = self.start(2, "--tp", "2", env0={"TETRA_TESTING_FAIL_STEP": "0", "TETRA_TESTING_FAIL_RANK": "1"})
        try:
            status, body, _ = zero.complete(prompt="fault", max_tokens=8)
            self.assertEqual(status, 500, body)
            self.assertIn("injected fault on rank 1", body["error"]["message"])
            self.assertEqual(wait_unhealthy_then_exit(zero), 1)
            self.assertEqual(other.wait(), 1)
            self.assertIn("injected fault on rank 1", other.log_text())
        finally:
            zero.stop()

    def test_a_node_started_with_other_flags_is_refused_by_both(self):
        addr = "127.0.0.1:%d" % free_port()
        group = (*CPU, "--tp", "2", "--nnodes", "2", "--dist-init-addr", addr)
        other = OtherNode(1, *group, "--max-running-requests", "3")
        zero = Server(*group, "--node-rank", "0", wait_ready=False)
        try:
            self.assertEqual(zero.proc.wait(60), 1)
            self.assertEqual(other.wait(), 1)
            for log in (zero.log_text(), other.log_text()):
                self.assertIn("node 1 has --max-running-requests 3 where node 0 has", log)
        finally:
            zero.stop()

    def test_bad_node_flags_are_refused_before_listening(self):
        for flags, message in ((["--tp", "2", "--nnodes", "2"], "needs --dist-init-addr"),
                               (["--tp", "3", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:1"],
                                "--nnodes 2 must divide the 3 ranks"),
                               (["--tp", "2", "--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "127.0.0.1:1"],
                                "--node-rank must be in [0, 2)"),
                               (["--tp", "2", "--nnodes", "2", "--dist-init-addr", "nowhere"], "HOST:PORT")):
            p = subprocess.run([TETRA, "serve", "--model", MODEL, "--port", "0", *CPU, *flags], capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn(message, p.stderr)
            self.assertNotIn("listening", p.stderr)


if __name__ == "__main__":
    unittest.main()
