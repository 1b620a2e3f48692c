// Prints the configuration table of docs/reference/configuration.md from the config schema: npm run -s docs:config
import { renderConfigTable } from "../src/service/config-table.js";

console.log(renderConfigTable());
