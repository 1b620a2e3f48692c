import net from "node:net";

export interface TcpProxy {
  /** The port to connect to instead of the target's. */
  readonly port: number;
  /** Destroy every open connection and close new ones as soon as they are accepted. */
  cut(): void;
  /** Stop moving bytes, both ways, while keeping sockets open: a silent network partition. */
  blackhole(): void;
  /** Keep forwarding what clients send but withhold the server's answers: requests land, acks are lost. */
  holdReplies(): void;
  /**
   * Black-hole the connections open now, for good, while new ones go through: a failed NAT or a failover
   * that leaves old sockets half-open (no FIN, no RST; the proxy still answers TCP keepalive probes).
   */
  freezeOpen(options?: FreezeOptions): void;
  /** Connections accepted so far (frozen ones included). */
  readonly accepted: number;
  /** Bytes clients sent into frozen connections: > 0 once something waits for an answer that never comes. */
  readonly swallowed: number;
  /** Forward again: new connections go through, blackholed ones resume where they stopped. */
  restore(): void;
  close(): Promise<void>;
}

export interface FreezeOptions {
  /**
   * The server's side stays open even after the client closes its socket: the client's FIN or RST never
   * reaches the server (a partition), so the server sees a session idle for good, as after a client vanished.
   */
  strandServerSide?: boolean;
}

interface Pair {
  client: net.Socket;
  upstream: net.Socket | undefined;
  onClientClose?: () => void;
}

function silence(pair: Pair): void {
  pair.client.unpipe();
  pair.upstream?.unpipe();
  pair.client.pause();
  pair.upstream?.pause();
}

/** A TCP forwarder on 127.0.0.1 for breaking a connection to a real server in a test. */
export async function startTcpProxy(target: { host: string; port: number }): Promise<TcpProxy> {
  let mode: "open" | "cut" | "blackhole" | "hold" = "open";
  const pairs = new Set<Pair>();

  const destroy = (pair: Pair) => {
    pairs.delete(pair);
    pair.client.destroy();
    pair.upstream?.destroy();
  };

  const connectUpstream = (pair: Pair) => {
    const upstream = net.connect(target.port, target.host);
    pair.upstream = upstream;
    upstream.on("error", () => destroy(pair));
    upstream.on("close", () => destroy(pair));
    pipeBoth(pair);
  };

  const pipeBoth = (pair: Pair) => {
    if (pair.upstream === undefined) return;
    pair.client.pipe(pair.upstream);
    // Held replies apply to connections opened later too: an HTTP client opens new ones for concurrent calls.
    if (mode === "hold") pair.upstream.pause();
    else pair.upstream.pipe(pair.client);
  };

  const frozen = new Set<Pair>();
  let accepted = 0;
  let swallowed = 0;
  const server = net.createServer((client) => {
    accepted++;
    client.on("error", () => {});
    if (mode === "cut") {
      client.destroy();
      return;
    }
    const pair: Pair = { client, upstream: undefined };
    pairs.add(pair);
    pair.onClientClose = () => destroy(pair);
    client.on("close", pair.onClientClose);
    if (mode === "open" || mode === "hold") connectUpstream(pair);
    else client.pause();
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve());
  });
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("proxy has no TCP address");

  return {
    port: address.port,
    cut() {
      mode = "cut";
      for (const pair of [...pairs]) destroy(pair);
    },
    get accepted() {
      return accepted;
    },
    get swallowed() {
      return swallowed;
    },
    blackhole() {
      mode = "blackhole";
      for (const pair of pairs) silence(pair);
    },
    freezeOpen(options = {}) {
      for (const pair of [...pairs]) {
        silence(pair);
        if (options.strandServerSide && pair.onClientClose) pair.client.off("close", pair.onClientClose);
        // Read and drop what the client sends: to it the socket looks alive, and the test can see a request
        // go into the black hole.
        pair.client.on("data", (chunk: Buffer) => {
          swallowed += chunk.length;
        });
        pair.client.resume();
        // Out of reach of restore(): these sockets stay open and silent until close().
        pairs.delete(pair);
        frozen.add(pair);
      }
    },
    holdReplies() {
      mode = "hold";
      for (const pair of pairs) {
        pair.upstream?.unpipe();
        pair.upstream?.pause();
      }
    },
    restore() {
      mode = "open";
      for (const pair of pairs) {
        if (pair.upstream === undefined) connectUpstream(pair);
        else {
          pair.client.unpipe();
          pair.upstream.unpipe();
          pipeBoth(pair);
        }
      }
    },
    async close() {
      mode = "cut";
      for (const pair of [...pairs, ...frozen]) destroy(pair);
      frozen.clear();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** A Postgres URL to `url`'s server through `proxy`: same user, database and options, the proxy's address. */
export function throughProxy(url: string, proxy: Pick<TcpProxy, "port">): string {
  const proxied = new URL(url);
  proxied.hostname = "127.0.0.1";
  proxied.port = String(proxy.port);
  return proxied.toString();
}

/** A proxy in front of the Postgres server that `url` names. */
export function startPostgresProxy(url: string): Promise<TcpProxy> {
  const target = new URL(url);
  return startTcpProxy({ host: target.hostname, port: Number(target.port || 5432) });
}
