#!/usr/bin/env python3
"""Regenerate smollm2_tokens.json: llama.cpp's token ids for SmolLM2-135M-Instruct (gpt2 BPE, pre
`smollm`) on a set of varied strings, as `llama-tokenize` (llama.cpp b11434) prints them.

    python3 make_smollm2_tokens.py ~/peers/llama-build/bin/llama-tokenize \
        ~/.cache/hf2q/models/SmolLM2-135M-Instruct.Q4_1.gguf > smollm2_tokens.json

Each string is fed through --stdin --no-escape (bytes exactly as written here), with and without
--no-parse-special. The model's add_bos_token is false, so no BOS is added either way.
"""
import json
import subprocess
import sys

STRINGS = [
    "Hello world",
    "Hello, world!",
    " Hello world",
    "  two leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "The quick brown fox jumps over the lazy dog.",
    "12345 678",
    "3.14159 and 1,000,000",
    "I'm sure you'll see they've done it, haven't they? We'd",
    "I'M SHOUTING'S",
    "multiple   spaces   between",
    "line one\nline two\n\nline four",
    "\n\n\n",
    "tabs\tand\t\ttabs",
    "mixed \t \n whitespace",
    "emoji: 😀🎉👍🏽 done",
    "👨‍👩‍👧‍👦",
    "中文字符测试",
    "日本語のテキストです。",
    "한국어 텍스트",
    "café naïve résumé Ångström",
    "Ünïcödé àccents",
    "Привет, мир!",
    "مرحبا بالعالم",
    "def main():\n    print(\"hi\")\n    return 0\n",
    "fn main() { let x: Vec<u32> = vec![1, 2, 3]; }",
    "<html><body class=\"x\">text</body></html>",
    "https://example.com/path?q=1&r=2#frag",
    "email@example.com",
    "$100.00 + 50% = ???",
    "a",
    "",
    " ",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>",
    "text<|endoftext|>more",
    "<|im_start|><|im_end|>",
    "not special: <|im_start without end",
    "x" * 40 + " " + "ab" * 20,
    "ﬁ ligature and ½ fraction ² superscript",
    "\u00a0non-breaking\u00a0space",
    "zero\u200bwidth",
]


def tokenize(exe, model, text, parse_special):
    args = [exe, "-m", model, "--stdin", "--no-escape", "--ids", "--log-disable"]
    if not parse_special:
        args.append("--no-parse-special")
    out = subprocess.run(args, input=text.encode(), capture_output=True, check=True).stdout.decode()
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def main():
    exe, model = sys.argv[1], sys.argv[2]
    cases = []
    for s in STRINGS:
        cases.append({
            "text": s,
            "ids": tokenize(exe, model, s, True),
            "ids_no_parse_special": tokenize(exe, model, s, False),
        })
    json.dump({
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "tool": "llama-tokenize (llama.cpp b11434) --stdin --no-escape --ids [--no-parse-special]",
        "cases": cases,
    }, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
