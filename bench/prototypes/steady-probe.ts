/**
 * Where steady-traffic pickup time goes: the steady job's traffic (single-message producer transactions at
 * `--rate` a second from 4 connections, one worker at defaults, in one process), with this project's named
 * statements timed per window, and the pickup split into commit → lease start (waiting for a fetch) and lease
 * start → handler start.
 *
 *   npx tsx bench/prototypes/steady-probe.ts --rate 500 --seconds 180 --window 30 [--prepared 0]
 */

import { arg, instrumentQueries, percentile, sleep, until } from "../lib.js";
import { outboxPeer } from "../peers/outbox.js";

const rate = Number(arg("rate", "500"));
const seconds = Number(arg("seconds", "180"));
const windowS = Number(arg("window", "30"));
const stats = instrumentQueries();
const peer = outboxPeer("bench_steady_probe");
await peer.setup();
const started = new Map<number, number>();
const prepared = arg("prepared", "1");
await peer.startWorker({
  ...(prepared === "0" ? { tuning: { preparedStatements: 0 } } : {}),
  concurrency: 10,
  listen: true,
  onJob: (p) => void started.set(p.orderId, performance.now()),
});
const producer = await peer.producer(4, "default");
const committed = new Map<number, number>();
const total = Math.round(rate * seconds);
const t0 = performance.now();
let from = 0;
let nextWindow = t0 + windowS * 1000;
const inflight = new Set<Promise<void>>();
const snap = () => new Map([...stats.timings].map(([k, v]) => [k, v.length]));
let before = snap();
for (let i = 0; i < total; i++) {
  const wait = t0 + (i * 1000) / rate - performance.now();
  if (wait > 0) await sleep(wait);
  const p: Promise<void> = producer.publish(i).then(() => {
    committed.set(i, performance.now());
    inflight.delete(p);
  });
  inflight.add(p);
  if (performance.now() >= nextWindow || i === total - 1) {
    await Promise.all(inflight);
    await until(() => started.size >= i + 1, 60_000, 5);
    const lat: number[] = [];
    for (let n = from; n <= i; n++)
      lat.push(Math.max(0, (started.get(n) ?? Number.NaN) - (committed.get(n) ?? Number.NaN)));
    const now = snap();
    const line: Record<string, string> = {
      at: ((performance.now() - t0) / 1000).toFixed(0),
      p50: percentile(lat, 50).toFixed(1),
      p99: percentile(lat, 99).toFixed(1),
    };
    for (const [label, n] of now) {
      const all = stats.timings.get(label) ?? [];
      const recent = all.slice(before.get(label) ?? 0, n);
      if (recent.length === 0) continue;
      line[label] =
        `${recent.length}× p50 ${percentile(recent, 50).toFixed(2)} p99 ${percentile(recent, 99).toFixed(2)}`;
    }
    console.log(JSON.stringify(line));
    before = now;
    from = i + 1;
    nextWindow += windowS * 1000;
  }
}
await peer.stopWorker();
await producer.close();
await peer.teardown();
