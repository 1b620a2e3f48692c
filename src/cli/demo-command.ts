export const demoUsage = "Usage: outbox-worker demo";
export async function demoCommand(_argv: string[]): Promise<number> {
  return 0;
}
