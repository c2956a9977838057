// The Vercel AI SDK (`ai` + `@ai-sdk/openai`) calling keel serve through the Responses API: a plain generateText,
// and two tool steps (tool_choice required, the tool's result sent back; store: true, so the SDK passes the
// earlier items back as item references). Prints one JSON line. KEEL_BASE_URL and KEEL_MODEL say where to go.
import { generateText, jsonSchema, stepCountIs, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";

const openai = createOpenAI({ baseURL: process.env.KEEL_BASE_URL, apiKey: "unused" });
const model = openai.responses(process.env.KEEL_MODEL);

const plain = await generateText({
  model,
  prompt: "What is the capital of France?",
  maxOutputTokens: 12,
  temperature: 0,
  maxRetries: 0,
});

const weather = tool({
  description: "Current weather of a city",
  inputSchema: jsonSchema({
    type: "object",
    properties: { city: { type: "string", enum: ["Paris", "Oslo"] } },
    required: ["city"],
    additionalProperties: false,
  }),
  execute: async ({ city }) => `18 C and sunny in ${city}`,
});
const tools = await generateText({
  model,
  prompt: "What is the weather in Paris?",
  tools: { get_weather: weather },
  toolChoice: "required",
  stopWhen: stepCountIs(2),
  maxOutputTokens: 64,
  temperature: 0,
  maxRetries: 0,
  providerOptions: { openai: { store: true, parallelToolCalls: false } },
});

const step = (s) => ({
  finishReason: s.finishReason,
  toolCalls: s.toolCalls.map((c) => ({ toolName: c.toolName, input: c.input })),
  toolResults: s.toolResults.map((r) => ({ toolName: r.toolName, output: r.output })),
});
console.log(
  JSON.stringify({
    plain: { text: plain.text, finishReason: plain.finishReason, usage: plain.usage },
    tools: { steps: tools.steps.map(step) },
  }),
);
