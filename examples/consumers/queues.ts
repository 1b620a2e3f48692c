// The demo's queue (`outbox-worker demo` places orders on it), as a queues module for
//   outbox-worker asyncapi --queues examples/consumers/queues.ts [--config examples/consumers/config/nats.json]
//   outbox-worker schemas --queues examples/consumers/queues.ts --out examples/consumers/schemas
// In your project: import { defineQueue } from "pg-outbox-worker".
import { z } from "zod";
import { defineQueue } from "../../src/produce/queue.js";

export const orderPlaced = defineQueue(
  "order.placed",
  z.object({ orderId: z.number().int(), customer: z.string(), totalCents: z.number().int().nonnegative() }),
);
