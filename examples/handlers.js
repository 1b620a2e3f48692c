// A handlers module for `outbox-worker run --handlers examples/handlers.js`.
// Each key is a queue; each value a handler, or { handler, schema?, retry?, maxAttempts? }.
export default {
  "order.placed": async (order, message) => {
    // Delivery is at least once: a real handler makes this idempotent, e.g. keyed by message.id.
    console.log(JSON.stringify({ delivered: message.id, queue: message.queue, order }));
  },
};
