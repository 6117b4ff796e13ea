// The official `openai` npm client (pinned in tests/server/node/package-lock.json) against a
// running tetra serve: completions, chat, streaming, and errors as the SDK surfaces them.
// Usage: node openai_client.mjs BASE_URL API_KEY   (exits non-zero on the first failed check)
import assert from "node:assert/strict";
import OpenAI from "openai";

const baseURL = process.argv[2];
const client = new OpenAI({ baseURL, apiKey: process.argv[3], maxRetries: 0, timeout: 60_000 });

const models = await client.models.list();
const model = models.data[0].id;
assert.ok(model, "a model is listed");
assert.equal((await client.models.retrieve(model)).id, model);

// A wrong key: AuthenticationError; an unknown model: NotFoundError, as the SDK maps OpenAI's.
const stranger = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0, timeout: 60_000 });
try {
  await stranger.models.list();
  assert.fail("expected a 401");
} catch (e) {
  assert.ok(e instanceof OpenAI.AuthenticationError, String(e));
  assert.equal(e.code, "invalid_api_key");
}
for (const call of [() => client.models.retrieve("no-such-model"),
                    () => client.completions.create({ model: "no-such-model", prompt: "x", max_tokens: 1 })]) {
  try {
    await call();
    assert.fail("expected a 404");
  } catch (e) {
    assert.ok(e instanceof OpenAI.NotFoundError, String(e));
    assert.equal(e.code, "model_not_found");
  }
}

// Completions, non-streaming.
const c = await client.completions.create({ model, prompt: "Hello", max_tokens: 8, temperature: 0, ignore_eos: true });
assert.equal(c.object, "text_completion");
assert.equal(c.choices.length, 1);
assert.equal(c.usage.completion_tokens, 8);
assert.equal(c.choices[0].finish_reason, "length");

// Completions, streaming, with usage: same text as non-streaming.
let text = "";
let usage = null;
let finish = null;
const s = await client.completions.create({ model, prompt: "Hello", max_tokens: 8, temperature: 0, ignore_eos: true,
                                            stream: true, stream_options: { include_usage: true } });
for await (const chunk of s) {
  if (chunk.usage) usage = chunk.usage;
  for (const ch of chunk.choices) {
    text += ch.text;
    if (ch.finish_reason) finish = ch.finish_reason;
  }
}
assert.equal(text, c.choices[0].text);
assert.equal(finish, "length");
assert.equal(usage.completion_tokens, 8);

// Chat, non-streaming and streaming.
const messages = [{ role: "system", content: "You are terse." }, { role: "user", content: "Say hi" }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0, ignore_eos: true,
                                                    logprobs: true, top_logprobs: 2 });
assert.equal(chat.object, "chat.completion");
assert.equal(chat.choices[0].message.role, "assistant");
assert.equal(chat.choices[0].logprobs.content.length, 10);
assert.equal(chat.choices[0].logprobs.content[0].top_logprobs.length, 2);
let chatText = "";
let role = null;
const cs = await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0, ignore_eos: true,
                                                  stream: true });
for await (const chunk of cs) {
  const d = chunk.choices[0]?.delta;
  if (d?.role) role = d.role;
  if (d?.content) chatText += d.content;
}
assert.equal(role, "assistant");
assert.equal(chatText, chat.choices[0].message.content);

// n choices with seeds.
const n = await client.completions.create({ model, prompt: "Hi", max_tokens: 4, n: 3, temperature: 1, seed: 5 });
assert.equal(n.choices.length, 3);

// Errors: the SDK raises BadRequestError with the status, param and message.
for (const [body, param] of [[{ temperature: 5 }, "temperature"], [{ max_tokens: 0 }, "max_tokens"],
                             [{ n: 0 }, "n"], [{ stop: "" }, "stop"]]) {
  try {
    await client.completions.create({ model, prompt: "x", ...body });
    assert.fail("expected a 400 for " + JSON.stringify(body));
  } catch (e) {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.status, 400);
    assert.equal(e.param, param);
    assert.ok(e.message.length > 0);
  }
}
try {
  await client.chat.completions.create({ model, messages: [] });
  assert.fail("expected a 400");
} catch (e) {
  assert.ok(e instanceof OpenAI.BadRequestError, String(e));
  assert.equal(e.param, "messages");
}
console.log("openai client: all checks passed");
