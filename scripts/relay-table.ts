// Prints the relay options table of docs/reference/relay-options.md from the relay config schemas:
// npm run -s docs:relays; with -- --write it pastes it into that page between its markers.
import { renderRelayOptionsTable } from "../src/relay/options-table.js";
import { printOrPaste } from "./doc-table.js";

printOrPaste(renderRelayOptionsTable(), "docs/reference/relay-options.md", "relay-table");
