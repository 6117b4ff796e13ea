"""A model folder as Kimi K2 publishes one: config.json with model_type kimi_k2 and a
tiktoken.model tokenizer (no tokenizer.json). Built here from the deepseek_v3-tiny config with
a vocabulary of 512 (the tiktoken model's 256 single bytes and Kimi's special tokens above them
must all have embedding rows), dummy weights, and Kimi's tokenizer class and special tokens;
`tetra tokenize`, `generate` and `serve` must all work on it."""
import base64
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from harness import ROOT, TETRA, Server

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "deepseek_v3-tiny")
VOCAB = 512
TEMPLATE = ("{%- for m in messages -%}"
            "{%- if m.role == 'user' -%}<|im_user|>user<|im_middle|>{{ m.content }}<|im_end|>"
            "{%- else -%}<|im_assistant|>assistant<|im_middle|>{{ m.content }}<|im_end|>{%- endif -%}"
            "{%- endfor -%}"
            "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}")


def make_kimi_folder(dest):
    with open(os.path.join(FIXTURE, "config.json")) as f:
        config = json.load(f)
    rope = config.pop("rope_parameters")
    for k in ("rope_interleave", "head_dim", "qk_head_dim", "dtype"):
        config.pop(k, None)
    config.update(model_type="kimi_k2", vocab_size=VOCAB, rope_theta=rope.pop("rope_theta"),
                  auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config"})
    rope["type"] = rope.pop("rope_type")
    config["rope_scaling"] = rope
    with open(os.path.join(dest, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(dest, "tiktoken.model"), "w") as f:
        for b in range(256):
            f.write("%s %d\n" % (base64.b64encode(bytes([b])).decode(), b))
    specials = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
                17: "<|im_middle|>"}
    tok_config = {"tokenizer_class": "TikTokenTokenizer", "bos_token": "[BOS]", "eos_token": "[EOS]",
                  "added_tokens_decoder": {str(256 + k): {"content": v, "special": True} for k, v in specials.items()},
                  "chat_template": TEMPLATE}
    with open(os.path.join(dest, "tokenizer_config.json"), "w") as f:
        json.dump(tok_config, f)


class KimiK2FolderTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tetra-kimi-")
        make_kimi_folder(cls.dir)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def run_tetra(self, *args):
        r = subprocess.run([TETRA, *args], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def test_tokenize_text_and_chat(self):
        out = json.loads(self.run_tetra("tokenize", "--model", self.dir, "--text", "héllo<|im_end|>", "--json"))
        self.assertEqual(out["ids"], list("héllo".encode()) + [258])
        chat = os.path.join(self.dir, "chat.json")
        with open(chat, "w") as f:
            json.dump([{"role": "user", "content": "hi"}], f)
        out = json.loads(self.run_tetra("tokenize", "--model", self.dir, "--chat", chat, "--json"))
        self.assertEqual(out["ids"], [259] + list(b"user") + [273] + list(b"hi") + [258, 260] + list(b"assistant") + [273])

    def test_generate(self):
        out = json.loads(self.run_tetra("generate", "--model", self.dir, "--load-format", "dummy", "--prompt", "hello",
                                        "--max-new-tokens", "4", "--json"))
        self.assertEqual(len(out["token_ids"]), 4)
        self.assertTrue(all(0 <= t < VOCAB for t in out["token_ids"]))
        # The text prompt is the five bytes of "hello": the same tokens as those ids given directly.
        out2 = json.loads(self.run_tetra("generate", "--model", self.dir, "--load-format", "dummy", "--prompt-ids",
                                         ",".join(str(b) for b in b"hello"), "--max-new-tokens", "4", "--json"))
        self.assertEqual(out2["token_ids"], out["token_ids"])
        self.assertEqual(out2["text"], out["text"])

    def test_serve(self):
        s = Server("--load-format", "dummy", model=self.dir)
        try:
            status, body, _ = s.complete(prompt="hello", max_tokens=3, temperature=0)
            self.assertEqual(status, 200, body)
            self.assertEqual(body["usage"]["prompt_tokens"], 5)
            self.assertEqual(body["usage"]["completion_tokens"], 3)
            status, body, _ = s.request("GET", "/v1/models")[0], json.loads(s.request("GET", "/v1/models")[2]), None
            self.assertEqual(body["data"][0]["vocab_size"], VOCAB)
        finally:
            self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    unittest.main()
