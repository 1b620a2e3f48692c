// The Docker image's HEALTHCHECK: GET /readyz on the worker's own HTTP server; exit 0 on 200, else 1 with
// one line (Docker keeps it in `docker inspect`). Plain CommonJS with no import of the CLI, because Node
// loading the CLI's module graph for `outbox-worker healthcheck` took seconds on a loaded host.
const http = require("node:http");

const TIMEOUT_MS = 3000;
const port = Number(process.env.OUTBOX_HTTP_PORT);
const bound = (process.env.OUTBOX_HTTP_HOST ?? "").trim().replace(/^\[(.*)\]$/, "$1");
// A bind-all address is where the server listens, not one to ask: the loopback reaches it.
const host = ["", "0.0.0.0", "::"].includes(bound) ? "127.0.0.1" : bound;
const path = process.argv[2] ?? "/readyz";

function fail(reason) {
  console.error(`healthcheck: http://${host}:${port}${path}: ${reason}`);
  process.exit(1);
}

if (!Number.isInteger(port) || port < 1 || port > 65535) fail("OUTBOX_HTTP_PORT is not a port number");
const request = http.get(
  { host, port, path, timeout: TIMEOUT_MS, headers: { connection: "close" } },
  (res) => {
    res.resume();
    if (res.statusCode === 200) process.exit(0);
    fail(`answered ${res.statusCode}`);
  },
);
request.on("timeout", () => fail(`no answer within ${TIMEOUT_MS} ms`));
request.on("error", (error) => fail(error.code ?? error.message));
