#!/usr/bin/env python3
"""Reference chat renders with Python jinja2, configured the way transformers'
apply_chat_template configures it: an ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks and loop controls, a tojson filter without HTML escaping (json.dumps with
ensure_ascii=False by default), raise_exception, and the variables messages, tools,
documents, add_generation_prompt, bos_token/eos_token and any extra ones.
usage: render_chat.py DATA_DIR CASES_DIR   writes DATA_DIR/chat_ref.jsonl
"""
import json
import os
import sys

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateRaised(Exception):
    pass


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise TemplateRaised(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def special_token(config, key):
    v = config.get(key)
    if isinstance(v, dict):
        v = v.get("content")
    return v


def main():
    data, cases_dir = sys.argv[1], sys.argv[2]
    templates = {}
    for model in ["deepseek_v3", "qwen3"]:
        with open(os.path.join(data, model, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        templates[model] = (config["chat_template"], config)
    for name in ["glm_style", "features"]:
        with open(os.path.join(cases_dir, name + ".jinja"), encoding="utf-8") as f:
            templates[name] = (f.read(), {"bos_token": "<s>", "eos_token": "</s>"})
    # Published templates of GLM-4.6 and Kimi K2 Thinking (chat_cases/README.md); they use
    # neither bos_token nor eos_token.
    for name in ["glm46", "kimi_k2_thinking"]:
        with open(os.path.join(cases_dir, name + ".jinja"), encoding="utf-8") as f:
            templates[name] = (f.read(), {})
    with open(os.path.join(cases_dir, "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    env = make_env()
    with open(os.path.join(data, "chat_ref.jsonl"), "w", encoding="utf-8") as out:
        for tname, (source, config) in templates.items():
            template = env.from_string(source)
            for case in cases:
                if "templates" in case and tname not in case["templates"]:
                    continue
                kwargs = dict(messages=case["messages"], tools=case.get("tools"), documents=None,
                              add_generation_prompt=case.get("add_generation_prompt", True))
                for key in ["bos_token", "eos_token"]:
                    if special_token(config, key) is not None:
                        kwargs[key] = special_token(config, key)
                if "enable_thinking" in case:
                    kwargs["enable_thinking"] = case["enable_thinking"]
                kwargs.update(case.get("extra", {}))
                row = {"template": tname, "case": case["name"]}
                try:
                    row["text"] = template.render(**kwargs)
                except Exception as e:  # the C++ side must fail too
                    row["error"] = f"{type(e).__name__}: {e}"
                out.write(json.dumps(row, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
