// A client engram did not write: the official TypeScript MCP SDK, run by node, on
// engram's MCP server over stdio or streamable HTTP. It does what an agent does with
// memory (list the tools, remember and wait for the receipt, recall, forget) and tries
// to reach another scope through an argument; it prints what it saw as one JSON line,
// and tests/agents/test_typescript_sdk.py checks it against the database.
//
//   node client.mjs '{"transport": "stdio", "command": "...", "args": [...], "env": {...},
//                     "text": "...", "query": "..."}'
//   node client.mjs '{"transport": "http", "url": "http://127.0.0.1:PORT/mcp",
//                     "token": "egt_...", "text": "...", "query": "..."}'
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const config = JSON.parse(process.argv[2]);

function transportOf(config) {
  if (config.transport === "stdio") {
    return new StdioClientTransport({
      command: config.command,
      args: config.args,
      env: config.env,
      cwd: config.cwd,
      stderr: "inherit",
    });
  }
  return new StreamableHTTPClientTransport(new URL(config.url), {
    requestInit: { headers: { Authorization: `Bearer ${config.token}` } },
  });
}

async function call(client, name, args) {
  // The SDK checks structuredContent against the tool's outputSchema when it has one.
  return client.callTool({ name, arguments: args });
}

async function committed(client, answer) {
  // A write answers "queued" past the server's bound: ask the operation tool until its
  // receipt is there (the operation stays on its stream and commits).
  let data = answer.structuredContent;
  for (let tries = 0; data.state === "queued" && tries < 600; tries++) {
    await new Promise((resolve) => setTimeout(resolve, 100));
    const state = (await call(client, "operation", { operation_id: data.operation_id }))
      .structuredContent;
    if (state.state !== "queued") data = { state: state.state, ...state.receipt };
  }
  return data;
}

const client = new Client({ name: "engram-ts-test", version: "1.0.0" });
const transport = transportOf(config);
await client.connect(transport);
const report = {
  protocolVersion: transport.protocolVersion ?? null,
  server: client.getServerVersion()?.name ?? null,
};
try {
  const { tools } = await client.listTools();
  report.tools = tools.map((t) => t.name);
  report.outputSchemas = tools.filter((t) => t.outputSchema).map((t) => t.name);

  const remembered = await call(client, "remember", { text: config.text });
  report.rememberSummary = remembered.content[0].text;
  const receipt = await committed(client, remembered);
  report.remembered = receipt;
  const id = receipt.records[0].id;

  const recalled = await call(client, "recall", { query: config.query });
  report.recallSummary = recalled.content[0].text;
  report.recalled = recalled.structuredContent.records.map((hit) => ({
    id: hit.record.id,
    text: hit.record.text,
  }));

  // An argument naming another scope is refused, and nothing is written.
  const planted = await call(client, "remember", {
    text: "Planted in another scope.",
    user_id: "someone-else",
  });
  report.planted = { isError: planted.isError ?? false, code: planted.structuredContent?.error?.code };

  const forgot = await call(client, "forget", { record_id: id, reason: "asked by the test" });
  report.forgetSummary = forgot.content[0].text;
  report.forgot = forgot.structuredContent;
  report.afterForget = (await call(client, "recall", { query: config.query })).structuredContent
    .records.length;
} finally {
  await client.close();
}
process.stdout.write(JSON.stringify(report) + "\n");
