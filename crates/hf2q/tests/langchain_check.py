"""LangChain's `ChatOpenAI(base_url=…)` against `hf2q serve`: invoke and stream (the same greedy text as
a plain chat completion), `.bind_tools()` with a forced tool, `.with_structured_output()` with a
pydantic model.

    python3 langchain_check.py BASE_URL API_KEY MODEL

Run by tests/serve.rs (`langchain_chat_openai`); exits non-zero with a message on the first failed check.
"""
import sys

import openai
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

base_url, api_key, model = sys.argv[1], sys.argv[2], sys.argv[3]


def check(cond, what):
    if not cond:
        sys.exit(f"langchain check failed: {what}")


question = "What is the capital of France? Answer in one sentence."
plain = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0).chat.completions.create(
    model=model, messages=[{"role": "user", "content": question}], temperature=0, max_tokens=24)
want = plain.choices[0].message.content

llm = ChatOpenAI(base_url=base_url, api_key=api_key, model=model, temperature=0, max_tokens=24, max_retries=0)
r = llm.invoke(question)
check(r.content == want, f"invoke {r.content!r} equals chat {want!r}")
streamed = "".join(c.content for c in llm.stream(question))
check(streamed == want, f"stream {streamed!r} equals {want!r}")


@tool
def get_weather(city: str) -> str:
    """Weather of a city."""
    return "sunny"


m = ChatOpenAI(base_url=base_url, api_key=api_key, model=model, temperature=0, max_tokens=64,
               max_retries=0).bind_tools([get_weather], tool_choice="get_weather").invoke(
    "What is the weather in Paris?")
check(len(m.tool_calls) == 1 and m.tool_calls[0]["name"] == "get_weather", f"tool_calls {m.tool_calls}")
check(isinstance(m.tool_calls[0]["args"].get("city"), str), f"tool args {m.tool_calls[0]['args']}")


class City(BaseModel):
    city: str


c = ChatOpenAI(base_url=base_url, api_key=api_key, model=model, temperature=0, max_tokens=40,
               max_retries=0).with_structured_output(City).invoke("Name the capital of France.")
check(isinstance(c, City) and c.city, f"structured output {c!r}")
print("langchain: all checks passed")
