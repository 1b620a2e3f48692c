import { registerSecrets, registerUrlSecrets } from "../util/redact.js";
import type { ServiceConfig } from "./config.js";

/**
 * Register every credential the service config holds, so logs, error texts (last_error, dead letters),
 * /readyz and CLI output mask it wherever it turns up, with or without its URL around it.
 */
export function registerConfigSecrets(
  config: Pick<ServiceConfig, "databaseUrl" | "listenUrl" | "relays"> &
    Partial<Pick<ServiceConfig, "console">>,
): void {
  // The console's bearer tokens: a request log or an error quoting a header must not show them.
  registerSecrets(config.console?.writeToken, config.console?.readToken);
  registerUrlSecrets(config.databaseUrl);
  registerUrlSecrets(config.listenUrl);
  for (const relay of Object.values(config.relays)) {
    switch (relay.type) {
      case "http":
        registerUrlSecrets(relay.url);
        // Static headers are there to carry credentials (authorization, api keys): every value counts.
        registerSecrets(...Object.values(relay.headers ?? {}));
        // The key may be quoted without its whsec_ prefix (it is what gets base64-decoded), or URL-encoded.
        for (const secret of [relay.signingSecret ?? []].flat()) {
          const key = secret.slice("whsec_".length);
          registerSecrets(secret, key, encodeURIComponent(key));
        }
        break;
      case "nats":
        for (const server of Array.isArray(relay.servers) ? relay.servers : [relay.servers]) {
          registerUrlSecrets(server);
        }
        break;
      case "redis":
      case "rabbitmq":
        registerUrlSecrets(relay.url);
        break;
    }
  }
}
