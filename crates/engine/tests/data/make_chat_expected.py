#!/usr/bin/env python3
"""Regenerate chat_expected.json: chat templates rendered by transformers' own Jinja renderer
(`transformers.utils.chat_template_utils.render_jinja_template`, transformers 5.24, jinja2 3.1),
as `apply_chat_template(..., tokenize=False)` does.

    python3 make_chat_expected.py ~/.cache/hf2q/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        ../../../../../shared/fixtures/tiny/qwen3/tokenizer_config.json > chat_expected.json

Templates: SmolLM2's (from the GGUF's tokenizer.chat_template) and the tiny qwen3 fixture's (tools,
tool calls, reasoning_content, enable_thinking). Each case lists messages, tools, kwargs and the
expected text; the Rust test renders the same inputs.
"""
import json
import sys

import gguf
from transformers.utils.chat_template_utils import render_jinja_template

smol = gguf.GGUFReader(sys.argv[1]).fields["tokenizer.chat_template"].contents()
qwen3 = json.load(open(sys.argv[2]))["chat_template"]

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city — “quoted” & <escaped?>",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}]

CASES = [
    ("smollm2", smol, "system_user", [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ], None, {}),
    ("smollm2", smol, "user_assistant_user", [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello. How can I help?"},
        {"role": "user", "content": "Tell me a joke about café owners 😀"},
    ], None, {}),
    ("qwen3", qwen3, "tools_no_thinking", [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
        {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call_0"},
        {"role": "user", "content": "  Thanks!  "},
    ], TOOLS, {"enable_thinking": False}),
    ("qwen3", qwen3, "thinking_history", [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA1"},
        {"role": "user", "content": "Q2"},
    ], None, {"enable_thinking": True}),
]

out = {"templates": {"smollm2": smol, "qwen3": qwen3}, "bos": "<|im_start|>", "eos": "<|im_end|>", "cases": []}
for tname, template, name, messages, tools, kwargs in CASES:
    text = render_jinja_template(
        conversations=[messages], tools=tools, chat_template=template, add_generation_prompt=True,
        bos_token=out["bos"], eos_token=out["eos"], **kwargs)[0][0]
    out["cases"].append({"template": tname, "name": name, "messages": messages, "tools": tools,
                         "kwargs": kwargs, "add_generation_prompt": True, "expected": text})
json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
sys.stdout.write("\n")
