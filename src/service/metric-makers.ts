import { Counter, Gauge, type Registry } from "prom-client";

/** Counters and gauges registered on the metrics' registry. */
export interface MetricMakers {
  readonly registers: Registry[];
  counter<L extends string>(name: string, help: string, labelNames?: L[]): Counter<L>;
  gauge<L extends string>(name: string, help: string, labelNames: L[]): Gauge<L>;
}

export function metricMakers(registry: Registry): MetricMakers {
  const registers = [registry];
  return {
    registers,
    counter: <L extends string>(name: string, help: string, labelNames: L[] = []) =>
      new Counter<L>({ name, help, labelNames, registers }),
    gauge: <L extends string>(name: string, help: string, labelNames: L[]) =>
      new Gauge<L>({ name, help, labelNames, registers }),
  };
}
