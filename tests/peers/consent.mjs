// The consent command of host_concurrent.mjs's policy (policy `[consent] command`): reads the
// broker's request on stdin, appends it to the log file named by argv[2], and approves every
// requested path except those with a path segment named "no" and the root `gated` as a whole
// (offered by the broker on the server's first roots/list): the server must ask for the parts
// it needs.
import fs from "node:fs";

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const request = JSON.parse(Buffer.concat(chunks).toString("utf8"));
fs.appendFileSync(process.argv[2], `${JSON.stringify(request)}\n`);
const approvedPaths = request.requestedPaths.filter((p) => !p.split("/").includes("no") && !p.endsWith("/gated"));
process.stdout.write(JSON.stringify({ approvedPaths }));
