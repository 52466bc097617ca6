"""The official `openai` Python package, unmodified, against `hf2q serve`: models listing, chat
(unary and streamed with usage), tools (a forced call, then the tool's result back), structured
output (`response_format` json_schema), completions, and the SDK's error classes.

    python3 openai_sdk.py BASE_URL API_KEY MODEL

Run by tests/serve.rs (`official_openai_python_sdk`); exits non-zero with a message on the first
failed check.
"""
import json
import sys

import openai

base_url, api_key, model = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        sys.exit(f"openai SDK check failed: {what}")


# Models
ids = [m.id for m in client.models.list()]
check(model in ids, f"{model} in models list {ids}")
check(client.models.retrieve(model).id == model, "models.retrieve")

# Chat, unary then streamed: greedy, so the same text
messages = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=24)
text = r.choices[0].message.content
check(isinstance(text, str) and text, "unary reply has content")
check(r.choices[0].finish_reason in ("stop", "length"), f"finish_reason {r.choices[0].finish_reason}")
check(r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, "usage counts")
check(r.object == "chat.completion" and r.id, "object and id")

parts, usage, finish = [], None, None
for chunk in client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=24,
                                            stream=True, stream_options={"include_usage": True}):
    if chunk.usage:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
check("".join(parts) == text, f"streamed text {''.join(parts)!r} equals unary {text!r}")
check(finish == r.choices[0].finish_reason, "streamed finish_reason")
check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, "streamed usage chunk")

# Tools: a forced call with valid arguments, then the tool's result back for an answer
tools = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
r = client.chat.completions.create(model=model, messages=ask, tools=tools, tool_choice="required",
                                   temperature=0, max_tokens=64)
msg = r.choices[0].message
check(r.choices[0].finish_reason == "tool_calls", f"finish_reason tool_calls, got {r.choices[0].finish_reason}")
check(msg.tool_calls and msg.tool_calls[0].function.name == "get_weather", "a get_weather call")
args = json.loads(msg.tool_calls[0].function.arguments)
check(isinstance(args.get("city"), str), f"arguments {args} have a city")
follow = ask + [
    {"role": "assistant", "content": None, "tool_calls": [tc.model_dump() for tc in msg.tool_calls]},
    {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": json.dumps({"temp_c": 18, "sky": "clear"})},
]
r = client.chat.completions.create(model=model, messages=follow, tools=tools, temperature=0, max_tokens=48)
check(r.choices[0].message.content or r.choices[0].message.tool_calls, "an answer after the tool result")

# Streamed forced tool call
calls = {}
for chunk in client.chat.completions.create(model=model, messages=ask, tools=tools, stream=True,
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                            temperature=0, max_tokens=64):
    for c in chunk.choices:
        for tc in c.delta.tool_calls or []:
            e = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            if tc.function.name:
                e["name"] += tc.function.name
            if tc.function.arguments:
                e["arguments"] += tc.function.arguments
check(calls and calls[0]["name"] == "get_weather", f"streamed tool call {calls}")
check(isinstance(json.loads(calls[0]["arguments"]).get("city"), str), "streamed arguments parse")

# Structured output
schema = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
r = client.chat.completions.create(
    model=model, temperature=0, max_tokens=64,
    messages=[{"role": "user", "content": "Invent a person and give their name and age."}],
    response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}},
)
obj = json.loads(r.choices[0].message.content)
check(set(obj) == {"name", "age"} and isinstance(obj["name"], str) and isinstance(obj["age"], int),
      f"json_schema reply {obj}")

# Completions
r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
check(r.object == "text_completion" and isinstance(r.choices[0].text, str), "completions")
r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2)
lp = r.choices[0].logprobs
check("".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == len(lp.tokens)
      and all(len(t) == 2 for t in lp.top_logprobs), f"completions logprobs {lp}")

# With one chat model, a name it does not have (agents' fixed "gpt-4o") is served by it and says so
raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages, temperature=0, max_tokens=24)
check(raw.headers.get("x-hf2q-model") == model, f"x-hf2q-model header {raw.headers.get('x-hf2q-model')}")
check(raw.parse().choices[0].message.content == text, "the substituted model's reply")

# Errors map to the SDK's classes
try:
    client.models.retrieve("no-such-model")
    check(False, "unknown model raised")
except openai.NotFoundError:
    pass
try:
    client.chat.completions.create(model=model, messages=messages, temperature=-3)
    check(False, "invalid temperature raised")
except openai.BadRequestError:
    pass
try:
    openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
    check(False, "wrong key raised")
except openai.AuthenticationError:
    pass
print("openai SDK: all checks passed")
