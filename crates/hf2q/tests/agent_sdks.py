"""The APIs coding agents speak, through the official SDKs, unmodified, against `hf2q serve`:
OpenAI's Responses API (`openai` package: `client.responses`) and Anthropic's Messages API
(`anthropic` package: `client.messages`). Each reply is checked against the chat-completions reply
for the same conversation (greedy, so the text must be equal), streamed and not, with a function
tool and its result round trip, json_schema output, `previous_response_id`, stored responses,
`count_tokens`, and the SDKs' error classes.

    python3 agent_sdks.py HOST:PORT API_KEY MODEL

Run by tests/serve.rs (`official_agent_sdks`); exits non-zero with a message on the first failed
check.
"""
import json
import sys

import anthropic
import openai

addr, api_key, model = sys.argv[1], sys.argv[2], sys.argv[3]
oai = openai.OpenAI(base_url=f"http://{addr}/v1", api_key=api_key, max_retries=0, timeout=120)
ant = anthropic.Anthropic(base_url=f"http://{addr}", api_key=api_key, max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        sys.exit(f"agent SDK check failed: {what}")


def chat(messages, max_tokens, **kw):
    r = oai.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens, **kw)
    return r.choices[0].message


question = "What is the capital of France? Answer in one sentence."
want = chat([{"role": "user", "content": question}], 24).content
check(want, "chat completions reply")

# --- Responses API -------------------------------------------------------------------------
r = oai.responses.create(model=model, input=question, temperature=0, max_output_tokens=24)
check(r.object == "response" and r.id.startswith("resp"), f"response object {r.object} {r.id}")
check(r.output_text == want, f"responses text {r.output_text!r} equals chat {want!r}")
check(r.status in ("completed", "incomplete"), f"status {r.status}")
check(r.usage.input_tokens > 0 and r.usage.output_tokens > 0, "responses usage")

deltas, types, final = [], [], None
for ev in oai.responses.create(model=model, input=question, temperature=0, max_output_tokens=24, stream=True):
    types.append(ev.type)
    if ev.type == "response.output_text.delta":
        deltas.append(ev.delta)
    if ev.type in ("response.completed", "response.incomplete"):
        final = ev.response
check(types[0] == "response.created", f"first event {types[:2]}")
check("response.output_item.added" in types and "response.output_item.done" in types, f"item events {types}")
check("".join(deltas) == want, f"streamed responses text {''.join(deltas)!r} equals {want!r}")
check(final is not None and final.output_text == want, "response.completed carries the reply")

# Function tool, forced, then its result back.
tools = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
r = oai.responses.create(model=model, input=ask, tools=tools, tool_choice={"type": "function", "name": "get_weather"},
                         temperature=0, max_output_tokens=64)
calls = [o for o in r.output if o.type == "function_call"]
check(len(calls) == 1 and calls[0].name == "get_weather", f"one function_call item: {r.output}")
check("city" in json.loads(calls[0].arguments), f"arguments {calls[0].arguments}")
streamed_args = []
for ev in oai.responses.create(model=model, input=ask, tools=tools, tool_choice={"type": "function", "name": "get_weather"},
                               temperature=0, max_output_tokens=64, stream=True):
    if ev.type == "response.function_call_arguments.delta":
        streamed_args.append(ev.delta)
check(json.loads("".join(streamed_args)) == json.loads(calls[0].arguments), "streamed call arguments")
follow = ask + [calls[0].model_dump(exclude_none=True),
                {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}]
r2 = oai.responses.create(model=model, input=follow, tools=tools, temperature=0, max_output_tokens=32)
chat_follow = chat(ask + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": calls[0].call_id, "type": "function", "function": {"name": "get_weather", "arguments": calls[0].arguments}}]},
    {"role": "tool", "tool_call_id": calls[0].call_id, "content": "Sunny, 21 C"}], 32,
    tools=[{"type": "function", "function": {k: v for k, v in tools[0].items() if k != "type"}}])
check(r2.output_text == (chat_follow.content or ""), f"tool result reply {r2.output_text!r} equals chat {chat_follow.content!r}")

# Structured output.
schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}
r = oai.responses.create(model=model, input="Name the capital of France as JSON.", temperature=0, max_output_tokens=40,
                         text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}})
check(isinstance(json.loads(r.output_text).get("city"), str), f"json_schema output {r.output_text!r}")

# previous_response_id continues a stored conversation.
first = oai.responses.create(model=model, input="My name is Ada. Say hello to me.", temperature=0, max_output_tokens=16)
second = oai.responses.create(model=model, previous_response_id=first.id, input="What is my name?", temperature=0,
                              max_output_tokens=16)
expect = chat([{"role": "user", "content": "My name is Ada. Say hello to me."},
               {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "What is my name?"}], 16).content
check(second.output_text == expect, f"previous_response_id reply {second.output_text!r} equals chat {expect!r}")
check(second.usage.input_tokens_details.cached_tokens >= 0, "cached token count")
check(oai.responses.retrieve(first.id).id == first.id, "responses.retrieve")
oai.responses.delete(first.id)
try:
    oai.responses.retrieve(first.id)
    check(False, "a deleted response is gone")
except openai.NotFoundError:
    pass
try:
    oai.responses.create(model=model, input=[{"type": "function_call_output", "call_id": "nope", "output": "x"}])
    check(False, "an output without its call is refused")
except openai.BadRequestError as e:
    check("input[0]" in str(e), f"the error names the item: {e}")

# --- Anthropic Messages API ----------------------------------------------------------------
# This SDK no longer has sampling arguments (Claude models dropped them); the API still takes
# `temperature` in the body, which is how a greedy reply is asked for here.
GREEDY = {"temperature": 0}
m = ant.messages.create(model=model, max_tokens=24, extra_body=GREEDY, messages=[{"role": "user", "content": question}])
text = "".join(b.text for b in m.content if b.type == "text")
check(m.type == "message" and m.role == "assistant", "message object")
check(text == want, f"messages text {text!r} equals chat {want!r}")
check(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason}")
with ant.messages.stream(model=model, max_tokens=24, extra_body=GREEDY, messages=[{"role": "user", "content": question}]) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
check(streamed == want, f"streamed messages text {streamed!r} equals {want!r}")
check(final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens, "final message")

atools = [{"name": "get_weather", "description": "Weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
m = ant.messages.create(model=model, max_tokens=64, extra_body=GREEDY, tools=atools,
                        tool_choice={"type": "tool", "name": "get_weather"}, messages=ask)
uses = [b for b in m.content if b.type == "tool_use"]
check(m.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather", f"tool_use: {m.content}")
check(isinstance(uses[0].input, dict) and "city" in uses[0].input, f"tool input {uses[0].input}")
with ant.messages.stream(model=model, max_tokens=64, extra_body=GREEDY, tools=atools,
                         tool_choice={"type": "tool", "name": "get_weather"}, messages=ask) as s:
    fm = s.get_final_message()
check([b.input for b in fm.content if b.type == "tool_use"] == [uses[0].input], "streamed tool_use input")
m2 = ant.messages.create(model=model, max_tokens=32, extra_body=GREEDY, tools=atools, messages=ask + [
    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 21 C"}]}])
expect = chat(ask + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": uses[0].id, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(uses[0].input, separators=(",", ":"))}}]},
    {"role": "tool", "tool_call_id": uses[0].id, "content": "Sunny, 21 C"}], 32,
    tools=[{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                             "parameters": atools[0]["input_schema"]}}]).content or ""
got = "".join(b.text for b in m2.content if b.type == "text")
check(got == expect, f"tool_result reply {got!r} equals chat {expect!r}")

m = ant.messages.create(model=model, max_tokens=40, extra_body=GREEDY, messages=[
    {"role": "user", "content": "Name the capital of France as JSON."}],
    output_config={"format": {"type": "json_schema", "schema": schema}})
check(isinstance(json.loads(m.content[0].text).get("city"), str), f"output_config.format JSON {m.content}")
n = ant.messages.count_tokens(model=model, messages=[{"role": "user", "content": question}])
one = ant.messages.create(model=model, max_tokens=1, messages=[{"role": "user", "content": question}])
check(n.input_tokens == one.usage.input_tokens + (one.usage.cache_read_input_tokens or 0),
      f"count_tokens {n.input_tokens} equals the prompt of a request")
m = ant.messages.create(model=model, max_tokens=40, extra_body=GREEDY, stop_sequences=["Paris"],
                        messages=[{"role": "user", "content": question}])
if m.stop_reason == "stop_sequence":
    check(m.stop_sequence == "Paris", f"stop_sequence {m.stop_sequence}")
try:
    ant.messages.create(model=model, max_tokens=8, messages=[
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}])
    check(False, "a tool_result without its tool_use is refused")
except anthropic.BadRequestError as e:
    check("tool_use_id" in str(e), f"the error names the block: {e}")
try:
    anthropic.Anthropic(base_url=f"http://{addr}", api_key="wrong", max_retries=0).messages.create(
        model=model, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    check(False, "a wrong key is refused")
except anthropic.AuthenticationError:
    pass
print("agent SDKs: all checks passed")
