import { randomBytes } from "node:crypto";
import net from "node:net";
import pg from "pg";
import { afterAll, afterEach, describe, expect, inject, it, vi } from "vitest";
import {
  createNotifier,
  type ListenerState,
  type Notifier,
  type NotifierOptions,
  SELF_TEST_PAYLOAD_PREFIX,
} from "../../src/notify/notifier.js";
import { listen } from "../support/database.js";

const url = inject("databaseUrl");
const pool = new pg.Pool({ connectionString: url, max: 3 });
const notifiers: Notifier[] = [];
const proxies: Proxy[] = [];

afterEach(async () => {
  // A test that failed with the clock stopped: what waits on a timer gets it, so the stops below end.
  if (vi.isFakeTimers()) vi.runOnlyPendingTimers();
  vi.useRealTimers();
  await Promise.all(notifiers.splice(0).map((n) => n.stop()));
  await Promise.all(proxies.splice(0).map((p) => p.close()));
});

afterAll(async () => {
  await pool.end();
});

const suffix = () => randomBytes(5).toString("hex");

/** Records callback arguments; waitFor resolves as soon as the predicate holds, or rejects at the deadline. */
class Recorder<T> {
  readonly events: T[] = [];
  readonly #waiters = new Set<() => void>();

  push = (event: T): void => {
    this.events.push(event);
    for (const wake of this.#waiters) wake();
  };

  waitFor(predicate: (events: T[]) => boolean, timeoutMs: number, what: string): Promise<T[]> {
    return new Promise((resolve, reject) => {
      const check = (): void => {
        if (!predicate(this.events)) return;
        cleanup();
        resolve(this.events);
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(
          new Error(
            `timed out after ${timeoutMs} ms waiting for ${what}; got ${JSON.stringify(this.events)}`,
          ),
        );
      }, timeoutMs);
      const cleanup = (): void => {
        clearTimeout(timer);
        this.#waiters.delete(check);
      };
      this.#waiters.add(check);
      check();
    });
  }
}

function harness(overrides: Partial<NotifierOptions> = {}) {
  const channel = `notif_${suffix()}`;
  const applicationName = `notifier-test-${suffix()}`;
  const wakes = new Recorder<string>();
  const states = new Recorder<ListenerState>();
  const errors = new Recorder<Error>();
  const reconnects = new Recorder<number>();
  const notifier = createNotifier({
    connectionString: url,
    channel,
    queues: new Set(["orders"]),
    applicationName,
    onWake: wakes.push,
    onReconnected: () => reconnects.push(reconnects.events.length + 1),
    onStateChange: (state) => states.push(state),
    onError: errors.push,
    ...overrides,
  });
  notifiers.push(notifier);
  return { channel, applicationName, notifier, wakes, states, errors, reconnects };
}

async function notify(channel: string, payload: string): Promise<void> {
  await pool.query("SELECT pg_notify($1, $2)", [channel, payload]);
}

async function sessions(applicationName: string): Promise<number> {
  const { rows } = await pool.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1",
    [applicationName],
  );
  return rows[0]?.n ?? 0;
}

/** Re-checks a database condition until it holds; the server has no event to wait on for a closed session. */
async function eventually(check: () => Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

describe("notifier", () => {
  it("wakes on a served queue", async () => {
    const h = harness();
    await h.notifier.start();
    expect(h.notifier.state).toBe("listening");
    expect(h.states.events).toEqual(["connecting", "listening"]);

    // The notifier has no timer of its own that could wake it: the wake is the notification's.
    await notify(h.channel, "orders");
    await h.wakes.waitFor((w) => w.includes("orders"), 10_000, "a wake for orders");
    expect(h.errors.events).toEqual([]);
  });

  it("ignores unserved queues, empty payloads and self-test payloads", async () => {
    const h = harness();
    await h.notifier.start();
    // Separate commits arrive in commit order, so once "orders" is in, everything sent before it was seen.
    await notify(h.channel, "billing");
    await notify(h.channel, `${SELF_TEST_PAYLOAD_PREFIX}not-a-queue`);
    await notify(h.channel, "");
    await notify(`${h.channel}_other`, "orders");
    await notify(h.channel, "orders");
    await h.wakes.waitFor((w) => w.length >= 1, 10_000, "a wake");
    expect(h.wakes.events).toEqual(["orders"]);
  });

  it('passes every queue with queues: "all", but never a self-test payload', async () => {
    const h = harness({ queues: "all" });
    await h.notifier.start();
    expect(h.notifier.state).toBe("listening");
    await notify(h.channel, "a.b");
    await notify(h.channel, `${SELF_TEST_PAYLOAD_PREFIX}fake`);
    await notify(h.channel, "billing/x");
    await h.wakes.waitFor((w) => w.includes("billing/x"), 10_000, "a wake for billing/x");
    // The start-up self-test's own notification went through this channel too.
    expect(h.wakes.events).toEqual(["a.b", "billing/x"]);
  });

  it("reconnects after its backend is terminated, then calls onReconnected and receives again", async () => {
    const h = harness();
    await h.notifier.start();
    expect(h.notifier.state).toBe("listening");

    const { rows } = await pool.query(
      "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
      [h.applicationName],
    );
    expect(rows).toHaveLength(1);

    await h.reconnects.waitFor((r) => r.length >= 1, 10_000, "onReconnected");
    const states = h.states.events;
    expect(states.indexOf("reconnecting")).toBeGreaterThan(0);
    expect(states.lastIndexOf("listening")).toBeGreaterThan(states.indexOf("reconnecting"));
    expect(h.notifier.state).toBe("listening");

    await notify(h.channel, "orders");
    await h.wakes.waitFor((w) => w.includes("orders"), 10_000, "a wake after the reconnect");

    await h.notifier.stop();
    await eventually(async () => (await sessions(h.applicationName)) === 0, 5_000, "the session to close");
  });

  it("start() against an unreachable server resolves, keeps retrying in the background, and stop() is quick", async () => {
    const h = harness({ connectionString: "postgres://x@127.0.0.1:1/x" });
    await expect(h.notifier.start()).resolves.toBeUndefined();
    expect(h.notifier.state).toBe("reconnecting");
    // Retries go on in the background and are reported, never thrown.
    await h.errors.waitFor((e) => e.length >= 2, 5_000, "two failed connection attempts");
    expect(h.errors.events[0]?.message).toMatch(/ECONNREFUSED/);

    // Time stands still from here on: a stop() that waited for the next retry, or for a close to time
    // out, would never return.
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "setInterval", "clearInterval"] });
    await h.notifier.stop();
    vi.useRealTimers();
    expect(h.notifier.state).toBe("stopped");
    expect(h.states.events.at(-1)).toBe("stopped");
  });

  it("switches to poll_only with one warning when its self-test notification never arrives", async () => {
    // The seam sends the self-test to a channel only this test listens on: each re-test is observable there.
    const selfTestChannel = `notif_void_${suffix()}`;
    const observer = await listen(url, selfTestChannel);
    try {
      const h = harness({ selfTestChannel, probeIntervalMs: 100, selfTestTimeoutMs: 300 });
      await h.notifier.start();
      expect(h.notifier.state).toBe("poll_only");
      expect(h.states.events).toEqual(["connecting", "poll_only"]);

      // Re-tests at growing intervals keep failing: still poll_only, still the one warning.
      await observer.waitFor(3, 30_000);
      expect(observer.received.every((p) => p.startsWith(SELF_TEST_PAYLOAD_PREFIX))).toBe(true);
      expect(h.notifier.state).toBe("poll_only");
      expect(h.errors.events).toHaveLength(1);
      expect(h.errors.events[0]?.message).toMatch(/did not receive its own test notification/);

      // It stays connected: a notification that does arrive is still a useful hint.
      await notify(h.channel, "orders");
      await h.wakes.waitFor((w) => w.includes("orders"), 10_000, "a wake in poll_only");
    } finally {
      await observer.close();
    }
  });

  it("a health probe that times out on a black-holed socket forces a reconnect", async () => {
    const proxy = await startProxy(url);
    const h = harness({ connectionString: proxy.url, probeIntervalMs: 200, probeTimeoutMs: 300 });
    await h.notifier.start();
    expect(h.notifier.state).toBe("listening");

    // The TCP connection stays up but nothing passes: only a query under a timeout can tell.
    proxy.blackholeAll();
    await h.reconnects.waitFor((r) => r.length >= 1, 10_000, "onReconnected");
    expect(h.errors.events.some((e) => /health probe/.test(e.message))).toBe(true);
    expect(h.notifier.state).toBe("listening");

    await notify(h.channel, "orders");
    await h.wakes.waitFor((w) => w.includes("orders"), 10_000, "a wake after the reconnect");
  });

  it("recreates the subscriber when pg-listen gives up reconnecting", async () => {
    const proxy = await startProxy(url);
    const h = harness({ connectionString: proxy.url });
    await h.notifier.start();
    expect(h.notifier.state).toBe("listening");

    // pg-listen reconnects, but its re-LISTEN fails: it emits its final error and never retries again.
    proxy.killListen = true;
    proxy.dropAll();
    await h.errors.waitFor(
      (e) => e.some((x) => /Re-initializing the PostgreSQL notification client/.test(x.message)),
      10_000,
      "pg-listen's final error",
    );
    expect(h.notifier.state).toBe("reconnecting");

    proxy.killListen = false;
    await h.reconnects.waitFor((r) => r.length >= 1, 15_000, "onReconnected");
    expect(h.notifier.state).toBe("listening");
    await notify(h.channel, "orders");
    await h.wakes.waitFor((w) => w.includes("orders"), 10_000, "a wake after the recreate");
  });

  it("a throwing onWake is reported and does not break delivery", async () => {
    let calls = 0;
    const h = harness({
      onWake: (queue) => {
        calls++;
        if (calls === 1) throw new Error("boom");
        h.wakes.push(queue);
      },
    });
    await h.notifier.start();
    await notify(h.channel, "orders");
    await notify(h.channel, "orders");
    await h.wakes.waitFor((w) => w.length >= 1, 10_000, "the second wake");
    expect(h.errors.events.map((e) => e.message)).toEqual([expect.stringMatching(/callback threw: boom/)]);
  });

  it("stop() is idempotent, closes the connection, and a later start() does nothing", async () => {
    const h = harness();
    await h.notifier.start();
    expect(await sessions(h.applicationName)).toBe(1);
    await Promise.all([h.notifier.stop(), h.notifier.stop()]);
    await h.notifier.stop();
    expect(h.notifier.state).toBe("stopped");
    await h.notifier.start();
    expect(h.notifier.state).toBe("stopped");
    await eventually(async () => (await sessions(h.applicationName)) === 0, 5_000, "the session to close");
  });
});

interface Proxy {
  readonly url: string;
  /** Kill a connection as soon as it sends a LISTEN. */
  killListen: boolean;
  /** Stop forwarding on every open connection without closing it. */
  blackholeAll(): void;
  dropAll(): void;
  close(): Promise<void>;
}

/** A TCP proxy to the test database that can black-hole or drop its connections. */
async function startProxy(target: string): Promise<Proxy> {
  const upstreamUrl = new URL(target);
  const pairs = new Set<{ client: net.Socket; upstream: net.Socket; blackholed: boolean }>();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(upstreamUrl.port || 5432), upstreamUrl.hostname);
    const pair = { client, upstream, blackholed: false };
    pairs.add(pair);
    const drop = (): void => {
      client.destroy();
      upstream.destroy();
      pairs.delete(pair);
    };
    client.on("data", (chunk: Buffer) => {
      if (pair.blackholed) return;
      if (proxy.killListen && chunk.includes("LISTEN ")) return drop();
      upstream.write(chunk);
    });
    upstream.on("data", (chunk: Buffer) => {
      if (!pair.blackholed) client.write(chunk);
    });
    for (const socket of [client, upstream]) {
      socket.on("error", drop);
      socket.on("close", drop);
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address() as net.AddressInfo;
  const proxied = new URL(target);
  proxied.hostname = "127.0.0.1";
  proxied.port = String(address.port);
  const proxy: Proxy = {
    url: proxied.toString(),
    killListen: false,
    blackholeAll: () => {
      for (const pair of pairs) pair.blackholed = true;
    },
    dropAll: () => {
      for (const pair of pairs) {
        pair.client.destroy();
        pair.upstream.destroy();
      }
    },
    close: async () => {
      proxy.dropAll();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  proxies.push(proxy);
  return proxy;
}
