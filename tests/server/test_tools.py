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
    # The whole history as Qwen3's template renders it: the turn's reasoning, content and call,
    # then the tool's result.
    {"when": "<|im_start|>assistant\n<think>\nI should call the tool.\n</think>\n\nLet me check.\n<tool_call>\n"
             "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
             "<|im_start|>user\n<tool_response>\n{\"temp_c\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
     "text": "<think>\nThe tool says 21.\n</think>\n\nIt is 21°C in Paris."},
    # The same result after a turn whose reasoning was not sent back.
    {"when": "<tool_response>\n{\"temp_c\": 21}\n</tool_response>", "text": "21°C; your history had no reasoning."},
    {"when": "Weather in Paris?",
     "text": "<think>\nI should call the tool.\n</think>\n\nLet me check.\n<tool_call>\n"
             "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"},
    {"when": "Broken call",
     "text": "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>"},
    {"when": "Two tools",
     "text": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
             "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>"},
]


# The other families' published templates and formats, served over the same tiny model (a
# template and a parser are text in, text out): (template file, parser flags, the reply that
# calls the tool, text the rendered tool result contains, the final reply).
CASES = os.path.join(ROOT, "tools", "tokenizer_ref", "chat_cases")
FAMILIES = {
    "glm": ("glm46.jinja", ["--tool-call-parser", "glm45", "--reasoning-parser", "glm45"],
            "<think>Need the tool.</think>\nLet me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
            "<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
            "<|observation|>\n<tool_response>\n{\"temp_c\": 21}\n</tool_response><|assistant|>",
            "<think>It said 21.</think>\nIt is 21°C."),
    "kimi": ("kimi_k2_thinking.jinja", ["--tool-call-parser", "kimi_k2", "--reasoning-parser", "deepseek_r1"],
             "<think>Need the tool.</think>Let me check.<|tool_calls_section_begin|><|tool_call_begin|>"
             "functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\", \"days\": 2}"
             "<|tool_call_end|><|tool_calls_section_end|>",
             "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n{\"temp_c\": 21}<|im_end|>",
             "<think>It said 21.</think>It is 21°C."),
    "deepseek": (None, ["--tool-call-parser", "deepseek_v3", "--reasoning-parser", "deepseek_r1"],
                 "Need the tool.</think>Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                 "get_weather\n```json\n{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                 "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{\"temp_c\": 21}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>",
                 "It said 21.</think>It is 21°C."),
}
DEEPSEEK_CONFIG = os.path.join(ROOT, "tests", ".cache", "tokenizer", "deepseek_v3", "tokenizer_config.json")


def family_model(folder, family):
    template, _, call, result, answer = FAMILIES[family]
    os.makedirs(folder)
    make_model(folder)
    if template:
        with open(os.path.join(CASES, template), encoding="utf-8") as f:
            source = f.read()
    else:
        with open(DEEPSEEK_CONFIG, encoding="utf-8") as f:
            source = json.load(f)["chat_template"]
    path = os.path.join(folder, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["chat_template"] = source
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    with open(os.path.join(folder, "script.json"), "w", encoding="utf-8") as f:
        json.dump([{"when": result, "text": answer}, {"when": "Weather in Paris?", "text": call}], f)


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

    def test_malformed_call_is_content(self):
        # A call whose JSON does not parse stays content (raw), whole and streamed; no tool_calls.
        s = Server(env={"TETRA_TESTING_SCRIPT": os.path.join(self.dir, "script.json")})
        try:
            tools = [{"type": "function", "function": {"name": "get_weather"}}]
            chat = {"messages": [{"role": "user", "content": "Broken call"}], "max_tokens": 300, "tools": tools}
            st, b, _ = s.post("/v1/chat/completions", chat)
            self.assertEqual(st, 200, b)
            want = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>"
            self.assertEqual(b["choices"][0]["message"]["content"], want)
            self.assertNotIn("tool_calls", b["choices"][0]["message"])
            self.assertEqual(b["choices"][0]["finish_reason"], "stop")
            st, events, raw = s.stream("/v1/chat/completions", {**chat, "stream": True})
            chunks = harness.stream_chunks(events)
            self.assertEqual(harness.stream_text(chunks), want)
            self.assertFalse(any(c["choices"] and "tool_calls" in c["choices"][0]["delta"] for c in chunks))
        finally:
            self.assertEqual(s.stop(), 0)

    def test_bad_testing_script(self):
        # The test hook fails like any bad input: one sentence, exit 1, before serving.
        for content in [None, "{\"when\": 1}", "[{\"when\": \"x\"}]"]:
            path = os.path.join(self.dir, "bad.json")
            if content is None:
                path = os.path.join(self.dir, "missing.json")
            else:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(content)
            with self.assertRaises(RuntimeError) as e:
                Server(env={"TETRA_TESTING_SCRIPT": path})
            self.assertIn("testing script", str(e.exception))
            self.assertNotIn("terminate called", str(e.exception))

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

    def test_other_families(self):
        # GLM-4.6, Kimi K2 and DeepSeek-V3: the call parsed (whole and streamed), the result
        # rendered by the family's template (the script answers only when it finds it), the answer.
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
        for family, (_, flags, _, _, _) in FAMILIES.items():
            with self.subTest(family=family):
                folder = os.path.join(self.dir, family)
                family_model(folder, family)
                harness.MODEL = folder
                s = Server(*flags, env={"TETRA_TESTING_SCRIPT": os.path.join(folder, "script.json")})
                try:
                    user = {"role": "user", "content": "Weather in Paris?"}
                    chat = {"messages": [user], "tools": tools, "max_tokens": 400}
                    st, b, _ = s.post("/v1/chat/completions", chat)
                    self.assertEqual(st, 200, b)
                    choice = b["choices"][0]
                    m = choice["message"]
                    self.assertEqual(choice["finish_reason"], "tool_calls", b)
                    self.assertEqual(m["reasoning_content"], "Need the tool.")
                    # What follows </think> is content as written (GLM writes a newline first).
                    lead = "\n" if family == "glm" else ""
                    self.assertEqual(m["content"], lead + "Let me check.")
                    self.assertEqual(len(m["tool_calls"]), 1, m)
                    call = m["tool_calls"][0]
                    self.assertEqual(call["function"]["name"], "get_weather")
                    self.assertEqual(json.loads(call["function"]["arguments"]), {"city": "Paris", "days": 2})
                    if family == "kimi":
                        self.assertEqual(call["id"], "functions.get_weather:0")  # the model's own id
                    st, events, raw = s.stream("/v1/chat/completions", {**chat, "stream": True})
                    self.assertEqual(st, 200, raw)
                    chunks = harness.stream_chunks(events)
                    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
                    self.assertEqual("".join(d.get("reasoning_content", "") for d in deltas), m["reasoning_content"])
                    self.assertEqual("".join(d.get("content") or "" for d in deltas), m["content"])
                    streamed = [tc for d in deltas for tc in d.get("tool_calls", [])]
                    self.assertEqual([(tc["index"], tc["function"]["name"], json.loads(tc["function"]["arguments"]))
                                      for tc in streamed], [(0, "get_weather", {"city": "Paris", "days": 2})])
                    self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "tool_calls")

                    history = [user, m, {"role": "tool", "tool_call_id": call["id"], "content": "{\"temp_c\": 21}"}]
                    st, b, _ = s.post("/v1/chat/completions", {**chat, "messages": history})
                    self.assertEqual(st, 200, b)
                    m2 = b["choices"][0]["message"]
                    self.assertEqual((m2["reasoning_content"], m2["content"]), ("It said 21.", lead + "It is 21°C."), b)
                    self.assertEqual(b["choices"][0]["finish_reason"], "stop")
                finally:
                    harness.MODEL = self.dir
                    self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "openai")):
        print("openai npm package missing: run scripts/fetch-server-test-data")
        sys.exit(1)
    if not os.path.exists(QWEN3_CONFIG):
        print("Qwen3 tokenizer_config.json missing: run scripts/fetch-test-data")
        sys.exit(1)
    unittest.main()
