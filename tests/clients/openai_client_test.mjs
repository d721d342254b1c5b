// The official openai npm client, unmodified, against a shoal gateway: structured output
// (response_format json_schema, with create() and with the client's parse() helper) and tool
// calling (tool_choice "required" and a named function, whole and through the client's
// streaming helper, which assembles tool-call deltas). Usage: node openai_client_test.mjs
// BASE_URL MODEL. Exits 0 when every check holds; otherwise prints what failed and exits 1.
import OpenAI from 'openai';

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: 'shoal-test', maxRetries: 0, timeout: 120_000 });
const failures = [];
const check = (ok, what) => { if (!ok) failures.push(what); };

const schema = {
  type: 'object',
  properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer' } },
  required: ['city', 'days'],
  additionalProperties: false,
};
const valid = (v) =>
  v !== null && typeof v === 'object' && !Array.isArray(v) && Object.keys(v).length === 2 &&
  typeof v.city === 'string' && [...v.city].length <= 12 && Number.isInteger(v.days);
const messages = [{ role: 'user', content: 'The weather in Paris for the next days, please.' }];
const response_format = { type: 'json_schema', json_schema: { name: 'weather', schema, strict: true } };

// Structured output.
const so = await client.chat.completions.create({ model, messages, response_format, max_tokens: 200, temperature: 0 });
let content = null;
try { content = JSON.parse(so.choices[0].message.content); } catch (e) { failures.push(`json_schema content is not JSON: ${so.choices[0].message.content}`); }
check(content === null || valid(content), `json_schema content does not validate: ${so.choices[0].message.content}`);
check(so.choices[0].finish_reason === 'stop', `json_schema finish_reason ${so.choices[0].finish_reason}`);
const parsed = await client.chat.completions.parse({ model, messages, response_format, max_tokens: 200, temperature: 0 });
check(valid(parsed.choices[0].message.parsed), `parse() gave ${JSON.stringify(parsed.choices[0].message.parsed)}`);

// Tool calling.
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Forecast for a city', parameters: schema } },
  { type: 'function', function: { name: 'ping', parameters: { type: 'object', properties: {}, additionalProperties: false } } },
];
const checkCalls = (msg, where, only) => {
  const calls = msg.tool_calls ?? [];
  check(calls.length >= 1, `${where}: no tool_calls in ${JSON.stringify(msg)}`);
  for (const c of calls) {
    check(c.type === 'function' && typeof c.id === 'string' && c.id.length > 0, `${where}: call ${JSON.stringify(c)}`);
    check(!only || c.function.name === only, `${where}: called ${c.function.name}, not ${only}`);
    let args = null;
    try { args = JSON.parse(c.function.arguments); } catch (e) { failures.push(`${where}: arguments not JSON: ${c.function.arguments}`); continue; }
    if (c.function.name === 'get_weather') check(valid(args), `${where}: get_weather arguments ${c.function.arguments}`);
    else check(c.function.name === 'ping' && Object.keys(args).length === 0, `${where}: ${c.function.name}(${c.function.arguments})`);
  }
  return calls;
};
const req = { model, messages, tools, tool_choice: 'required', parallel_tool_calls: false, max_tokens: 300, temperature: 0 };
const whole = await client.chat.completions.create(req);
check(whole.choices[0].finish_reason === 'tool_calls', `required: finish_reason ${whole.choices[0].finish_reason}`);
const calls = checkCalls(whole.choices[0].message, 'required');
const stream = client.chat.completions.stream(req);
const streamed = await stream.finalChatCompletion();
const scalls = checkCalls(streamed.choices[0].message, 'required, streamed');
check(JSON.stringify(scalls.map((c) => c.function)) === JSON.stringify(calls.map((c) => c.function)),
      `streamed calls ${JSON.stringify(scalls)} differ from ${JSON.stringify(calls)}`);
const named = await client.chat.completions.create({ ...req, tool_choice: { type: 'function', function: { name: 'get_weather' } } });
check(checkCalls(named.choices[0].message, 'named', 'get_weather').length === 1, 'named: not exactly one call');

// A bad request surfaces as the client's BadRequestError with the field named.
try {
  await client.chat.completions.create({ ...req, tool_choice: { type: 'function', function: { name: 'nope' } } });
  failures.push('an unknown tool_choice function was accepted');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.param === 'tool_choice', `unknown function: ${e}`);
}

if (failures.length) {
  console.error(failures.join('\n'));
  process.exit(1);
}
console.log(`ok: openai ${OpenAI.VERSION ?? ''}, ${calls.length} call(s): ${JSON.stringify(calls.map((c) => c.function))}`);
