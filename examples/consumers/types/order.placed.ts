/* Generated from examples/consumers/schemas/order.placed.schema.json by scripts/consumer-types.ts (json-schema-to-typescript): do not edit. */

/**
 * Payload of outbox queue "order.placed": the event data each relay sends.
 */
export interface OrderPlaced {
  orderId: number;
  customer: string;
  totalCents: number;
}
