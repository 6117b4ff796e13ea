"""What `tetra serve` (and the CLI beside it) takes from the model folder's files:
generation_config.json (EOS ids, sampling defaults), the tokenizer's special tokens and BOS
(one rule for /v1/completions, `tetra generate` and `tetra tokenize`), the context the KV cache
can hold, and every flag checked against those files before the server listens."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from harness import MODEL, TETRA, Server, assert_error


def run(*args):
    return subprocess.run([TETRA, *args], capture_output=True, text=True, timeout=120)


def generate_json(model, *args):
    r = run("generate", "--model", model, "--threads", "1", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def tokenize_ids(model, *args):
    r = run("tokenize", "--model", model, "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ids"]


def refused_before_listening(test, *flags, model=None, says=()):
    """The server exits non-zero with one sentence naming `says`, without ever listening."""
    s = Server(*flags, wait_ready=False, model=model)
    try:
        rc = s.proc.wait(60)
    except subprocess.TimeoutExpired:
        s.stop()
        test.fail("tetra serve %s kept running:\n%s" % (" ".join(flags), s.log_text()))
    log = s.log_text()
    test.assertNotEqual(rc, 0, log)
    test.assertNotIn("listening on", log)
    for part in says:
        test.assertIn(part, log)
    return log


class ModelFolder:
    """A scratch copy of the fixture model whose files a test may rewrite."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tetra-model-")
        self.path = os.path.join(self.dir, "model")
        shutil.copytree(MODEL, self.path)

    def read(self, name):
        with open(os.path.join(self.path, name)) as f:
            return json.load(f)

    def write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value if isinstance(value, str) else json.dumps(value))

    def close(self):
        shutil.rmtree(self.dir)


class ModelFilesTest(unittest.TestCase):
    def setUp(self):
        self.folder = ModelFolder()
        self.model = self.folder.path

    def tearDown(self):
        self.folder.close()

    def serve(self, *flags):
        s = Server(*flags, model=self.model)
        self.addCleanup(lambda: self.assertEqual(s.stop(), 0, s.log_text()))
        return s

    def test_generation_config_eos_ends_generation(self):
        prompt = [1, 2, 3]
        first = generate_json(self.model, "--prompt-ids", "1,2,3", "--max-new-tokens", "4")["token_ids"][0]
        self.assertNotEqual(first, 511)  # config.json's EOS would end it anyway
        # generation_config.json lists a second EOS id (as Qwen3's does): the first token generated.
        self.folder.write("generation_config.json", {"eos_token_id": [511, first]})
        out = generate_json(self.model, "--prompt-ids", "1,2,3", "--max-new-tokens", "4")
        self.assertEqual(out["token_ids"], [first])
        self.assertEqual(out["finish_reason"], "stop")
        s = self.serve()
        st, b, _ = s.complete(prompt=prompt, max_tokens=4, temperature=0)
        self.assertEqual(st, 200, b)
        self.assertEqual(b["choices"][0]["finish_reason"], "stop")
        self.assertEqual(b["usage"]["completion_tokens"], 1)

    def test_generation_config_sampling_defaults(self):
        body = {"prompt": [5, 6, 7], "max_tokens": 8, "ignore_eos": True}
        greedy_body = {**body, "temperature": 0}

        def texts(s):
            return [s.complete(**body, seed=seed)[1]["choices"][0]["text"] for seed in (1, 2, 3)]

        self.folder.write("generation_config.json", {"eos_token_id": 511, "temperature": 0.0, "top_k": 5})
        s = self.serve()
        self.assertIn("sampling defaults from", s.log_text())
        self.assertIn("temperature 0, top_k 5", s.log_text())
        greedy = s.complete(**greedy_body)[1]["choices"][0]["text"]
        # No temperature in the request: the file's 0, so every seed gives the greedy text.
        self.assertEqual(texts(s), [greedy] * 3)
        # A request's own value wins.
        hot = [s.complete(**body, temperature=1.0, top_k=0, seed=seed)[1]["choices"][0]["text"] for seed in (1, 2, 3)]
        self.assertGreater(len(set(hot)), 1)
        # --generation-config vllm ignores the file: OpenAI's temperature 1.
        v = self.serve("--generation-config", "vllm")
        self.assertGreater(len(set(texts(v))), 1)
        # A folder of its own.
        other = tempfile.mkdtemp(prefix="tetra-genconf-")
        self.addCleanup(shutil.rmtree, other)
        with open(os.path.join(other, "generation_config.json"), "w") as f:
            json.dump({"temperature": 0.0}, f)
        self.folder.write("generation_config.json", {"temperature": 1.0})
        f = self.serve("--generation-config", other)
        self.assertEqual(texts(f), [greedy] * 3)

    def test_generation_config_repetition_penalty_default(self):
        body = {"prompt": [5, 6, 7, 8, 5, 6, 7, 8], "max_tokens": 24, "ignore_eos": True, "temperature": 0}

        def text(s, **extra):
            st, b, _ = s.complete(**body, **extra)
            self.assertEqual(st, 200, b)
            return b["choices"][0]["text"]

        self.folder.write("generation_config.json", {"eos_token_id": 511, "repetition_penalty": 1e30})
        s = self.serve()
        self.assertIn("repetition_penalty 1e+30", s.log_text())
        plain, penalized = text(s, repetition_penalty=1), text(s, repetition_penalty=1e30)
        self.assertNotEqual(plain, penalized)
        # No repetition_penalty in the request: the file's.
        self.assertEqual(text(s), penalized)
        self.assertEqual(text(s, repetition_penalty=None), penalized)
        # --generation-config vllm: vLLM's default, off.
        v = self.serve("--generation-config", "vllm")
        self.assertEqual(text(v), plain)
        # The file's value is checked as a request's would be.
        self.folder.write("generation_config.json", {"repetition_penalty": 0})
        refused_before_listening(self, model=self.model, says=["repetition_penalty"])

    def test_malformed_generation_config_is_a_load_error(self):
        self.folder.write("generation_config.json", "{not json")
        refused_before_listening(self, model=self.model, says=["generation_config.json is not valid JSON"])
        self.folder.write("generation_config.json", {"top_p": 3})
        refused_before_listening(self, model=self.model, says=['"top_p" is 3'])
        self.folder.write("generation_config.json", {"eos_token_id": 511})
        refused_before_listening(self, "--generation-config", "/no/such/folder", model=self.model,
                                 says=["--generation-config", "/no/such/folder"])

    def test_special_tokens_in_completion_prompts(self):
        text = "<|im_start|>user\nhi<|im_end|>"
        ids = tokenize_ids(self.model, "--text", text)
        self.assertEqual(ids[0], 510)
        self.assertEqual(ids[-1], 511)
        gen = generate_json(self.model, "--prompt", text, "--max-new-tokens", "1")
        self.assertEqual(gen["prompt_tokens"], len(ids))
        s = self.serve()
        st, b, _ = s.complete(prompt=text, max_tokens=1)
        self.assertEqual(st, 200, b)
        self.assertEqual(b["usage"]["prompt_tokens"], len(ids))

    def test_bos_by_the_tokenizers_rule_and_once_in_chat(self):
        config = self.folder.read("tokenizer_config.json")
        config["add_bos_token"] = True
        config["bos_token"] = "<|endoftext|>"
        config["chat_template"] = "{{ bos_token }}" + config["chat_template"]
        self.folder.write("tokenizer_config.json", config)
        bare = tokenize_ids(self.model, "--text", "hello", "--no-add-special-tokens")
        ids = tokenize_ids(self.model, "--text", "hello")
        self.assertEqual(ids, [509] + bare)
        self.assertEqual(generate_json(self.model, "--prompt", "hello", "--max-new-tokens", "1")["prompt_tokens"],
                         len(ids))
        messages = [{"role": "user", "content": "hello"}]
        path = os.path.join(self.folder.dir, "chat.json")
        with open(path, "w") as f:
            json.dump(messages, f)
        chat_ids = tokenize_ids(self.model, "--chat", path)
        self.assertEqual(chat_ids[0], 509)
        self.assertNotEqual(chat_ids[1], 509)  # the template's BOS, not a second one
        s = self.serve()
        st, b, _ = s.complete(prompt="hello", max_tokens=1)
        self.assertEqual(st, 200, b)
        self.assertEqual(b["usage"]["prompt_tokens"], len(ids))
        st, b, _ = s.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1})
        self.assertEqual(st, 200, b)
        self.assertEqual(b["usage"]["prompt_tokens"], len(chat_ids))

    def test_context_shortened_to_the_kv_cache(self):
        s = self.serve("--kv-memory", "100K")
        log = s.log_text()
        context = json.loads(s.request("GET", "/v1/models")[2])["data"][0]["max_model_len"]
        self.assertLess(context, 4096)
        self.assertIn("serving a context of %d tokens" % context, log)
        self.assertIn("context %d tokens" % context, log)
        # No max_tokens: the rest of the context, never a 400.
        st, b, _ = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        self.assertEqual(st, 200, b)
        self.assertLessEqual(b["usage"]["prompt_tokens"] + b["usage"]["completion_tokens"], context)
        # A prompt that fills the context alone: 400 naming both numbers.
        st, b, _ = s.complete(prompt=[1] * context, max_tokens=1)
        assert_error(self, st, b, 400, "prompt")
        self.assertIn("%d tokens and your request has %d input tokens" % (context, context), b["error"]["message"])

    def test_context_length_flag_and_alias(self):
        s = self.serve("--max-model-len", "48")
        self.assertEqual(json.loads(s.request("GET", "/v1/models")[2])["data"][0]["max_model_len"], 48)
        # A context chosen by the operator that the KV cache cannot hold: refused at start.
        s = Server("--kv-memory", "100K", "--context-length", "4096", wait_ready=False, model=self.model)
        rc = s.proc.wait(60)
        self.assertNotEqual(rc, 0)
        self.assertIn("--context-length 4096", s.log_text())
        self.assertIn("--kv-memory", s.log_text())

    def test_flags_checked_before_listening(self):
        refused_before_listening(self, "--context-length", "100000", model=self.model,
                                 says=["--context-length 100000", "4096"])
        log = refused_before_listening(self, "--kv-memory", "900000G", model=self.model,
                                       says=["--kv-memory asks for 900000 GiB", "GiB of memory available"])
        self.assertNotIn("kv_memory_bytes", log)
        tok = self.folder.read("tokenizer.json")
        tok["added_tokens"].append({"id": 600, "content": "<|extra|>", "special": True, "single_word": False,
                                    "lstrip": False, "rstrip": False, "normalized": False})
        self.folder.write("tokenizer.json", tok)
        refused_before_listening(self, model=self.model, says=["601 token ids", "vocab_size of 512"])
        r = run("generate", "--model", self.model, "--prompt", "hi")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("vocab_size of 512", r.stderr)


if __name__ == "__main__":
    unittest.main()
