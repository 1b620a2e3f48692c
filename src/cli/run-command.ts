export const runUsage = "Usage: outbox-worker run [options]";
export async function runCommand(_argv: string[]): Promise<number> {
  throw new Error("not implemented yet");
}
