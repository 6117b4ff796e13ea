"""Tool calling and reasoning end to end with the official openai npm client. A random tiny
model never writes a tool call, so the server runs with TETRA_TESTING_SCRIPT (test-only,
server/testing_script.h): replies chosen by what the rendered prompt contains. The model folder
is the tiny Qwen3 fixture with Qwen3's real chat template (from scripts/fetch-test-data), so
the tools and the tool-call history go through the template as they would for Qwen3."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import harness
from harness import ROOT, Server, assert_error

NODE_DIR = os.path.join(ROOT, "tests", ".cache", "server", "node")
QWEN3_CONFIG = os.path.join(ROOT, "tests", ".cache", "tokenizer", "qwen3", "tokenizer_config.json")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "qwen3_moe-tiny")

# First match wins: the tool result's turn contains the first question too.
SCRIPT = [
    {"when": "<think>\n\n</think>", "text": "Plain answer."},
    {"when": "<tool_response>\n{\"temp_c\": 21}", "text": "<think>\nThe tool says 21.\n</think>\n\nIt is 21°C in Paris."},
    {"when": "Weather in Paris?",
     "text": "<think>\nI should call the tool.\n</think>\n\nLet me check.\n<tool_call>\n"
             "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"},
    {"when": "Two tools",
     "text": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
             "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>"},
]


def make_model(folder):
    for name in ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json"]:
        shutil.copyfile(os.path.join(FIXTURE, name), os.path.join(folder, name))
    with open(os.path.join(FIXTURE, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    with open(QWEN3_CONFIG, encoding="utf-8") as f:
        config["chat_template"] = json.load(f)["chat_template"]
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    with open(os.path.join(folder, "script.json"), "w", encoding="utf-8") as f:
        json.dump(SCRIPT, f)


class ToolsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tetra-tools-")
        make_model(cls.dir)
        harness.MODEL = cls.dir

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_openai_client_round_trip(self):
        s = Server("--reasoning-parser", "qwen3", env={"TETRA_TESTING_SCRIPT": os.path.join(self.dir, "script.json")})
        try:
            self.assertIn("tool-call parser hermes, reasoning parser qwen3", s.log_text())
            script = os.path.join(NODE_DIR, "tools_client.mjs")
            shutil.copyfile(os.path.join(ROOT, "tests", "server", "tools_client.mjs"), script)
            r = subprocess.run(["node", script, "http://127.0.0.1:%d/v1" % s.port],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr + s.log_text())
            self.assertIn("all checks passed", r.stdout)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_without_parsers(self):
        # --tool-call-parser none: tools with tool_choice auto are refused (as vLLM does without
        # --enable-auto-tool-choice); "none" still renders. No --reasoning-parser: thinking stays content.
        s = Server("--tool-call-parser", "none", env={"TETRA_TESTING_SCRIPT": os.path.join(self.dir, "script.json")})
        try:
            tools = [{"type": "function", "function": {"name": "get_weather"}}]
            chat = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 300, "tools": tools}
            st, b, _ = s.post("/v1/chat/completions", chat)
            assert_error(self, st, b, 400, "tool_choice")
            st, b, _ = s.post("/v1/chat/completions", {**chat, "tool_choice": "none"})
            self.assertEqual(st, 200, b)
            message = b["choices"][0]["message"]
            self.assertTrue(message["content"].startswith("<think>\nI should call the tool.\n</think>"), message)
            self.assertNotIn("reasoning_content", message)
            self.assertNotIn("tool_calls", message)
        finally:
            self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "openai")):
        print("openai npm package missing: run scripts/fetch-server-test-data")
        sys.exit(1)
    if not os.path.exists(QWEN3_CONFIG):
        print("Qwen3 tokenizer_config.json missing: run scripts/fetch-test-data")
        sys.exit(1)
    unittest.main()
