// An MCP 2026-07-28 server made with the TypeScript SDK v2 (`serveStdio`: it speaks both eras,
// the first request deciding). Its tools ask the client for roots the new way (an
// `input_required` result), for roots and a confirmation at once, and read a file through the
// client's `files/read` in 1 MiB chunks. Run by modern_host.mjs under `fsbroker proxy`.
import { createHash } from 'node:crypto';
import { McpServer, inputRequired, inputResponse, acceptedContent } from '@modelcontextprotocol/server';
import { serveStdio } from '@modelcontextprotocol/server/stdio';
import * as z from 'zod/v4';

const confirm = z.object({ confirm: z.boolean() });
const text = (t) => ({ content: [{ type: 'text', text: t }] });

serveStdio(({ era }) => {
  const server = new McpServer({ name: 'modern-ts-server', version: '1.0.0' }, { capabilities: { tools: {} } });
  server.registerTool('show_roots', { inputSchema: z.object({}) }, async (_a, ctx) => {
    const r = inputResponse(ctx.mcpReq.inputResponses, 'roots');
    if (r.kind !== 'roots') return inputRequired({ inputRequests: { roots: inputRequired.listRoots() } });
    return text(JSON.stringify({ era, roots: r.roots.map((x) => x.uri) }));
  });
  server.registerTool('confirm_and_roots', { inputSchema: z.object({ path: z.string() }) }, async ({ path }, ctx) => {
    const ok = acceptedContent(ctx.mcpReq.inputResponses, 'confirm', confirm);
    const r = inputResponse(ctx.mcpReq.inputResponses, 'roots');
    if (ok === undefined || r.kind !== 'roots') {
      return inputRequired({
        inputRequests: {
          confirm: inputRequired.elicit({ message: `Really touch ${path}?`, requestedSchema: confirm }),
          roots: inputRequired.listRoots(),
        },
        requestState: 'round-1',
      });
    }
    return text(JSON.stringify({ confirm: ok.confirm, roots: r.roots.map((x) => x.uri), state: ctx.mcpReq.requestState() }));
  });
  // files/read is not a method of the revision: the SDK sends it as an ordinary request and
  // insists on `resultType` in the answer.
  const chunk = z.object({ content: z.string(), length: z.number(), eof: z.boolean() }).passthrough();
  server.registerTool('read_file_chunks', { inputSchema: z.object({ path: z.string(), chunk: z.number() }) }, async ({ path, chunk: size }, ctx) => {
    const hash = createHash('sha256');
    let offset = 0;
    let chunks = 0;
    for (;;) {
      const r = await ctx.mcpReq.send(
        { method: 'files/read', params: { path, offset, length: size, encoding: 'base64' } },
        chunk,
      );
      const bytes = Buffer.from(r.content, 'base64');
      hash.update(bytes);
      offset += bytes.length;
      chunks += 1;
      if (r.eof) break;
    }
    return text(JSON.stringify({ sha256: hash.digest('hex'), bytes: offset, chunks }));
  });
  return server;
}, { onerror: (e) => process.stderr.write(`[modern_server] ${e}\n`) });
