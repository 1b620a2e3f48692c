// Prints the relay options table of docs/reference/relay-options.md from the relay config schemas: npm run -s docs:relays
import { renderRelayOptionsTable } from "../src/relay/options-table.js";

console.log(renderRelayOptionsTable());
