import { existsSync } from "node:fs";
import { type Browser, chromium } from "playwright-core";

const CANDIDATES = ["/usr/bin/chromium", "/usr/bin/chromium-browser"];

/** The Chromium to drive: CHROMIUM_PATH, else Debian's package (`.ci/run` installs it when it can). */
export function chromiumPath(): string | undefined {
  const fromEnv = process.env.CHROMIUM_PATH;
  if (fromEnv) return existsSync(fromEnv) ? fromEnv : undefined;
  return CANDIDATES.find((p) => existsSync(p));
}

/** Why the browser tests cannot run here, or undefined when they can. */
export function chromiumMissing(): string | undefined {
  if (chromiumPath()) return undefined;
  return process.env.CHROMIUM_PATH
    ? `CHROMIUM_PATH=${process.env.CHROMIUM_PATH} does not exist`
    : `no Chromium at ${CANDIDATES.join(" or ")} (install Debian's chromium, or set CHROMIUM_PATH)`;
}

export function launchChromium(): Promise<Browser> {
  const executablePath = chromiumPath();
  if (!executablePath) throw new Error(chromiumMissing());
  return chromium.launch({
    executablePath,
    // No sandbox: CI runs as root in a container, where Chromium's sandbox cannot start.
    args: ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
}
