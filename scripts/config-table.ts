// Prints the configuration table of docs/reference/configuration.md from the config schema:
// npm run -s docs:config; with -- --write it pastes it into that page between its markers.
import { renderConfigTable } from "../src/service/config-table.js";
import { printOrPaste } from "./doc-table.js";

printOrPaste(renderConfigTable(), "docs/reference/configuration.md", "config-table");
