// Prints the README's relay options table from the relay config schemas: npm run -s docs:relays
import { renderRelayOptionsTable } from "../src/relay/options-table.js";

console.log(renderRelayOptionsTable());
