"""The official openai npm client as a real client: completions, chat, streaming, errors, the
API key and model lookups.
Fails when scripts/fetch-server-test-data (run by scripts/test) has not installed it."""
import os
import shutil
import subprocess
import sys
import unittest

from harness import ROOT, Server

NODE_DIR = os.path.join(ROOT, "tests", ".cache", "server", "node")


class OpenAIClientTest(unittest.TestCase):
    def test_openai_npm_client(self):
        s = Server("--api-key", "sk-tetra-test")
        try:
            # ES modules resolve packages from the script's folder: run a copy beside node_modules.
            script = os.path.join(NODE_DIR, "openai_client.mjs")
            shutil.copyfile(os.path.join(ROOT, "tests", "server", "openai_client.mjs"), script)
            r = subprocess.run(["node", script, "http://127.0.0.1:%d/v1" % s.port, "sk-tetra-test"],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("all checks passed", r.stdout)
        finally:
            self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "openai")):
        print("openai npm package missing: run scripts/fetch-server-test-data")
        sys.exit(1)
    unittest.main()
