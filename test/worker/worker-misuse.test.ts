import { beforeAll, describe, expect, it } from "vitest";
import { OutboxError } from "../../src/index.js";
import { testDatabase } from "../support/database.js";
import { workerFactory } from "../support/worker.js";

/** A worker used out of order says so with an OutboxError, which callers can tell from a driver's error. */

const db = testDatabase("misuse");
const workers = workerFactory(db);

beforeAll(async () => {
  await db.migrate();
});

describe("worker misuse", () => {
  it("a second start() is refused with an OutboxError", async () => {
    const worker = await workers.start({ queues: { misuse: async () => {} } });
    const again = worker.start();
    await expect(again).rejects.toThrow("worker cannot start: it is running");
    await expect(again).rejects.toBeInstanceOf(OutboxError);
  });
});
