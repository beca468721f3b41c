// A deliberately faulty MCP server over stdio, for the tests of what a
// session does when a server misbehaves. `node faulty.mjs garbage` prints
// lines that are not JSON-RPC and never answers; `node faulty.mjs` answers
// the handshake and offers its tools: `ok` answers, `hang` never answers,
// `crash` exits in the middle of the call, `big` answers 200,000 characters.
import { createInterface } from "node:readline";

const mode = process.argv[2] ?? "tools";
if (mode === "garbage") {
  process.stdout.write("this is not JSON-RPC\n{\"neither\": is this}\n");
  setInterval(() => process.stdout.write("still garbage\n"), 200);
} else {
  const send = (message) => process.stdout.write(JSON.stringify(message) + "\n");
  const schema = { type: "object", properties: { text: { type: "string" } } };
  createInterface({ input: process.stdin }).on("line", (line) => {
    const request = JSON.parse(line);
    if (request.id === undefined) return; // a notification
    const reply = (result) => send({ jsonrpc: "2.0", id: request.id, result });
    switch (request.method) {
      case "initialize":
        return reply({
          protocolVersion: request.params.protocolVersion,
          capabilities: { tools: {} },
          serverInfo: { name: "faulty", version: "1.0.0" },
        });
      case "tools/list":
        return reply({
          tools: [
            { name: "ok", description: "Answers", inputSchema: schema },
            { name: "hang", description: "Never answers", inputSchema: schema },
            { name: "crash", description: "Exits mid-call", inputSchema: schema },
            { name: "big", description: "Answers 200,000 characters", inputSchema: schema },
            { name: "bad-schema", description: "Has no object schema", inputSchema: { type: "string" } },
          ],
        });
      case "tools/call":
        if (request.params.name === "crash") {
          process.stderr.write("faulty: crashing on purpose\n");
          process.exit(3);
        }
        if (request.params.name === "hang") return;
        if (request.params.name === "big") {
          const lines = Array.from({ length: 4000 }, (_, i) => `line ${String(i).padStart(5, "0")} ${"x".repeat(38)}`);
          return reply({ content: [{ type: "text", text: lines.join("\n") }] });
        }
        return reply({ content: [{ type: "text", text: `ok: ${request.params.arguments?.text ?? ""}` }] });
      case "ping":
        return reply({});
      default:
        return send({ jsonrpc: "2.0", id: request.id, error: { code: -32601, message: "no such method" } });
    }
  });
}
