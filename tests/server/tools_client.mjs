// Tool calling and reasoning output through the official `openai` npm client, against a tetra
// serve whose replies are scripted (TETRA_TESTING_SCRIPT, set up by test_tools.py): a tool-call
// round trip (the call, the tool's result, the final answer) and the reasoning split, each
// streamed and not, plus tool_choice, parallel_tool_calls and chat_template_kwargs.
// Usage: node tools_client.mjs BASE_URL   (exits non-zero on the first failed check)
import assert from "node:assert/strict";
import OpenAI from "openai";

const baseURL = process.argv[2];
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60_000 });
const model = (await client.models.list()).data[0].id;

const tools = [
  { type: "function", function: { name: "get_weather", description: "Current weather for a city.",
                                  parameters: { type: "object", properties: { city: { type: "string" } },
                                                required: ["city"] } } },
  { type: "function", function: { name: "add", parameters: { type: "object",
                                  properties: { a: { type: "number" }, b: { type: "number" } } } } },
];
const base = { model, tools, max_tokens: 300, temperature: 0 };

// Streams a request and puts the deltas back together the way clients do (tool calls by index,
// arguments concatenated).
async function streamed(body) {
  const out = { content: "", reasoning: "", reasoning2: "", calls: [], finish: null, role: null };
  const s = await client.chat.completions.create({ ...body, stream: true });
  for await (const chunk of s) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    const d = ch.delta;
    if (d.role) out.role = d.role;
    if (d.content) out.content += d.content;
    if (d.reasoning_content) out.reasoning += d.reasoning_content;
    if (d.reasoning) out.reasoning2 += d.reasoning;
    for (const tc of d.tool_calls ?? []) {
      assert.equal(typeof tc.index, "number");
      const call = (out.calls[tc.index] ??= { id: "", type: "", function: { name: "", arguments: "" } });
      if (tc.id) call.id = tc.id;
      if (tc.type) call.type = tc.type;
      if (tc.function?.name) call.function.name += tc.function.name;
      if (tc.function?.arguments) call.function.arguments += tc.function.arguments;
    }
    if (ch.finish_reason) out.finish = ch.finish_reason;
  }
  return out;
}

function sameCalls(got, want) {
  assert.equal(got.length, want.length);
  for (let i = 0; i < want.length; ++i) {
    assert.equal(got[i].type, "function");
    assert.match(got[i].id, /.+/);
    assert.equal(got[i].function.name, want[i].function.name);
    assert.deepEqual(JSON.parse(got[i].function.arguments), JSON.parse(want[i].function.arguments));
  }
}

// 1. The model calls a tool (after thinking about it).
const user = { role: "user", content: "Weather in Paris?" };
const first = await client.chat.completions.create({ ...base, messages: [user] });
const m1 = first.choices[0].message;
assert.equal(first.choices[0].finish_reason, "tool_calls");
assert.equal(m1.role, "assistant");
assert.equal(m1.content, "\n\nLet me check.");  // what follows </think>, as vLLM returns it
assert.equal(m1.reasoning_content, "\nI should call the tool.\n");
assert.equal(m1.reasoning, m1.reasoning_content);  // vLLM 0.11+'s name for the same
assert.equal(m1.tool_calls.length, 1);
assert.equal(m1.tool_calls[0].type, "function");
assert.match(m1.tool_calls[0].id, /^chatcmpl-tool-/);
assert.equal(m1.tool_calls[0].function.name, "get_weather");
assert.deepEqual(JSON.parse(m1.tool_calls[0].function.arguments), { city: "Paris" });
const s1 = await streamed({ ...base, messages: [user] });
assert.equal(s1.role, "assistant");
assert.equal(s1.finish, "tool_calls");
assert.equal(s1.content, m1.content);
assert.equal(s1.reasoning, m1.reasoning_content);
assert.equal(s1.reasoning2, m1.reasoning_content);
sameCalls(s1.calls, m1.tool_calls);

// 2. The tool's result goes back with the call (the message as returned); the model answers.
const history = [user, m1, { role: "tool", tool_call_id: m1.tool_calls[0].id, content: '{"temp_c": 21}' }];
const second = await client.chat.completions.create({ ...base, messages: history });
const m2 = second.choices[0].message;
assert.equal(second.choices[0].finish_reason, "stop");
assert.equal(m2.content, "\n\nIt is 21°C in Paris.");
assert.equal(m2.reasoning_content, "\nThe tool says 21.\n");
assert.ok(!m2.tool_calls || m2.tool_calls.length === 0);
// The same history with the reasoning under vLLM 0.11+'s name only: the template still gets it.
const { reasoning_content: _, ...m1Renamed } = m1;
const renamed = await client.chat.completions.create({ ...base, messages: [user, m1Renamed, history[2]] });
assert.equal(renamed.choices[0].message.content, m2.content);
const s2 = await streamed({ ...base, messages: history });
assert.equal(s2.finish, "stop");
assert.equal(s2.content, m2.content);
assert.equal(s2.reasoning, m2.reasoning_content);
assert.equal(s2.calls.length, 0);

// 2b. The SDK's own tool loop (beta runTools), streamed and not: it runs get_weather with the
// parsed arguments, sends the result back under the call's id and returns the final answer.
// Streamed, the SDK rebuilds the turn from the deltas without the reasoning fields, so the
// history it sends back has none (the script answers that history differently).
for (const stream of [false, true]) {
  const seen = [];
  const runner = client.beta.chat.completions.runTools({
    ...base, stream, messages: [user],
    tools: [{ type: "function", function: { name: "get_weather", parse: JSON.parse,
                                            parameters: tools[0].function.parameters,
                                            function: (args) => { seen.push(args); return '{"temp_c": 21}'; } } }],
  });
  assert.equal(await runner.finalContent(), stream ? "21°C; your history had no reasoning." : m2.content);
  assert.deepEqual(seen, [{ city: "Paris" }]);
}

// 3. Two calls in one turn: indexes 0 and 1; parallel_tool_calls false keeps the first.
const two = [{ role: "user", content: "Two tools please" }];
const p = await client.chat.completions.create({ ...base, messages: two });
assert.deepEqual(p.choices[0].message.tool_calls.map((c) => c.function.name), ["get_weather", "add"]);
assert.deepEqual(JSON.parse(p.choices[0].message.tool_calls[1].function.arguments), { a: 2, b: 3 });
assert.equal(p.choices[0].message.content, null);
const ps = await streamed({ ...base, messages: two });
sameCalls(ps.calls, p.choices[0].message.tool_calls);
const single = await client.chat.completions.create({ ...base, messages: two, parallel_tool_calls: false });
assert.deepEqual(single.choices[0].message.tool_calls.map((c) => c.function.name), ["get_weather"]);

// 4. tool_choice "none": the call is not parsed, its text is content. A named function works.
const none = await client.chat.completions.create({ ...base, messages: [user], tool_choice: "none" });
assert.equal(none.choices[0].finish_reason, "stop");
assert.ok(none.choices[0].message.content.includes("<tool_call>"));
assert.ok(!none.choices[0].message.tool_calls || none.choices[0].message.tool_calls.length === 0);
const named = await client.chat.completions.create({
  ...base, messages: [user], tool_choice: { type: "function", function: { name: "get_weather" } } });
assert.equal(named.choices[0].message.tool_calls[0].function.name, "get_weather");
const required = await client.chat.completions.create({ ...base, messages: [user], tool_choice: "required" });
assert.equal(required.choices[0].finish_reason, "tool_calls");

// 5. chat_template_kwargs reach the template: enable_thinking false renders Qwen3's empty
// thinking block into the prompt, which the script answers without reasoning.
const plain = await client.chat.completions.create({
  ...base, messages: [{ role: "user", content: "Hello" }], chat_template_kwargs: { enable_thinking: false } });
assert.equal(plain.choices[0].message.content, "Plain answer.");
assert.equal(plain.choices[0].message.reasoning_content, null);
const plainStream = await streamed({ ...base, messages: [{ role: "user", content: "Hello" }],
                                     chat_template_kwargs: { enable_thinking: false } });
assert.equal(plainStream.content, "Plain answer.");
assert.equal(plainStream.reasoning, "");

// 6. Malformed tools are 400s the SDK reports with the field.
for (const [body, param] of [[{ tools: [{ type: "function", function: { description: "x" } }] }, "tools[0].function.name"],
                             [{ tools: [{ type: "function", function: { name: "f", parameters: 3 } }] },
                              "tools[0].function.parameters"],
                             [{ tool_choice: { type: "function", function: { name: "nope" } } }, "tool_choice"]]) {
  try {
    await client.chat.completions.create({ ...base, messages: [user], ...body });
    assert.fail("expected a 400 for " + JSON.stringify(body));
  } catch (e) {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.status, 400);
    assert.equal(e.param, param);
  }
}
console.log("tools client: all checks passed");
