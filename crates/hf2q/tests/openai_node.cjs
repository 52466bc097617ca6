// The official `openai` Node SDK (npm, unmodified) against `hf2q serve`: `client.responses.create`
// unary and streamed (the same greedy text as chat completions), a forced function tool and its
// function_call_output round trip, json_schema output, previous_response_id, and the SDK's error
// classes.
//
//     NODE_PATH=…/nodelib/node_modules node openai_node.cjs BASE_URL API_KEY MODEL
//
// Run by tests/serve.rs (`official_openai_node_sdk`); exits non-zero with a message on the first
// failed check.
const OpenAI = require('openai');

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });

function check(cond, what) {
  if (!cond) {
    console.error(`openai node check failed: ${what}`);
    process.exit(1);
  }
}

async function chat(messages, max_tokens, extra = {}) {
  const r = await client.chat.completions.create({ model, messages, temperature: 0, max_tokens, ...extra });
  return r.choices[0].message;
}

(async () => {
  const q = 'What is the capital of France? Answer in one sentence.';
  const want = (await chat([{ role: 'user', content: q }], 24)).content;
  const r = await client.responses.create({ model, input: q, temperature: 0, max_output_tokens: 24 });
  check(r.object === 'response', `object ${r.object}`);
  check(r.output_text === want, `responses text ${JSON.stringify(r.output_text)} equals chat ${JSON.stringify(want)}`);

  const stream = await client.responses.create({ model, input: q, temperature: 0, max_output_tokens: 24, stream: true });
  let text = '';
  const types = [];
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
  }
  check(types[0] === 'response.created', `first event ${types[0]}`);
  check(types.includes('response.completed') || types.includes('response.incomplete'), `final event in ${types}`);
  check(text === want, `streamed ${JSON.stringify(text)} equals ${JSON.stringify(want)}`);

  const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
  const t = await client.responses.create({ model, input: ask, tools, tool_choice: { type: 'function', name: 'get_weather' },
    temperature: 0, max_output_tokens: 64 });
  const call = t.output.find((o) => o.type === 'function_call');
  check(call && call.name === 'get_weather' && typeof JSON.parse(call.arguments).city === 'string', `function_call ${JSON.stringify(t.output)}`);
  const t2 = await client.responses.create({ model, tools, temperature: 0, max_output_tokens: 32,
    input: [...ask, call, { type: 'function_call_output', call_id: call.call_id, output: 'Sunny, 21 C' }] });
  const c2 = await chat([...ask, { role: 'assistant', content: null, tool_calls: [{ id: call.call_id, type: 'function',
    function: { name: 'get_weather', arguments: call.arguments } }] }, { role: 'tool', tool_call_id: call.call_id, content: 'Sunny, 21 C' }],
  32, { tools: [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city', parameters: tools[0].parameters } }] });
  check(t2.output_text === (c2.content || ''), `tool result reply ${JSON.stringify(t2.output_text)} equals chat ${JSON.stringify(c2.content)}`);

  const schema = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false };
  const j = await client.responses.create({ model, input: 'Name the capital of France as JSON.', temperature: 0, max_output_tokens: 40,
    text: { format: { type: 'json_schema', name: 'city', schema, strict: true } } });
  check(typeof JSON.parse(j.output_text).city === 'string', `json_schema ${j.output_text}`);

  const a = await client.responses.create({ model, input: 'My name is Ada. Say hello to me.', temperature: 0, max_output_tokens: 16 });
  const b = await client.responses.create({ model, previous_response_id: a.id, input: 'What is my name?', temperature: 0, max_output_tokens: 16 });
  const c = await chat([{ role: 'user', content: 'My name is Ada. Say hello to me.' }, { role: 'assistant', content: a.output_text },
    { role: 'user', content: 'What is my name?' }], 16);
  check(b.output_text === c.content, `previous_response_id ${JSON.stringify(b.output_text)} equals chat ${JSON.stringify(c.content)}`);

  try {
    await client.responses.create({ model, input: [{ type: 'function_call_output', call_id: 'nope', output: 'x' }] });
    check(false, 'an output without its call is refused');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError, `BadRequestError, got ${e}`);
  }
  console.log('openai node: all checks passed');
})().catch((e) => {
  console.error(`openai node check failed: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
});
