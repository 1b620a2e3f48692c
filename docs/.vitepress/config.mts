import path from "node:path";
import { fileURLToPath } from "node:url";
import { type DefaultTheme, defineConfig } from "vitepress";
import { deadBuiltLinks } from "./built-links.js";
import { repoLinks } from "./repo-links.js";

const docsRoot = path.dirname(path.dirname(fileURLToPath(import.meta.url)));

const guide: DefaultTheme.SidebarItem[] = [
  {
    text: "Start",
    items: [
      { text: "Getting started", link: "/guide/getting-started" },
      { text: "Installing", link: "/guide/installing" },
    ],
  },
  {
    text: "Producing",
    items: [
      { text: "Publishing", link: "/guide/publishing" },
      { text: "Topics and subscriptions", link: "/guide/topics" },
      { text: "Per-key ordering", link: "/guide/ordering" },
      { text: "Dedupe keys and cancel", link: "/guide/dedupe-and-cancel" },
    ],
  },
  {
    text: "Handling",
    items: [
      { text: "The worker", link: "/guide/worker" },
      { text: "Follow-up messages", link: "/guide/follow-ups" },
      { text: "Exactly-once effects", link: "/guide/exactly-once" },
      { text: "Failure announcements", link: "/guide/failure-announcements" },
      { text: "Testing handlers", link: "/guide/testing-handlers" },
      { text: "Tracing with OpenTelemetry", link: "/guide/tracing" },
      { text: "Describing queues", link: "/guide/describing-queues" },
    ],
  },
];

const operate: DefaultTheme.SidebarItem[] = [
  {
    text: "Running",
    items: [
      { text: "The service", link: "/operate/service" },
      { text: "Configuration", link: "/operate/configuration" },
      { text: "Migrating", link: "/operate/migrating" },
      { text: "Least-privilege roles", link: "/operate/roles" },
    ],
  },
  {
    text: "Relays",
    items: [
      { text: "Built-in relays", link: "/operate/relays/" },
      { text: "HTTP (webhooks)", link: "/operate/relays/http" },
      { text: "NATS JetStream", link: "/operate/relays/nats" },
      { text: "RabbitMQ", link: "/operate/relays/rabbitmq" },
      { text: "Redis Streams", link: "/operate/relays/redis" },
    ],
  },
  {
    text: "Watching",
    items: [
      { text: "Health and metrics", link: "/operate/health" },
      { text: "Web console", link: "/operate/console" },
      { text: "Inspecting", link: "/operate/inspecting" },
      { text: "Table health", link: "/operate/table-health" },
      { text: "Dead-letter retention", link: "/operate/retention" },
    ],
  },
  {
    text: "Deploying",
    items: [
      { text: "Scaling and replicas", link: "/operate/scaling" },
      { text: "Docker", link: "/operate/docker" },
      { text: "Kubernetes", link: "/operate/kubernetes" },
      { text: "Behind PgBouncer", link: "/operate/pgbouncer" },
    ],
  },
];

const reference: DefaultTheme.SidebarItem[] = [
  {
    text: "Reference",
    items: [
      { text: "API", link: "/api/README" },
      { text: "Schema", link: "/reference/schema" },
      { text: "Tables and indexes", link: "/reference/tables" },
      { text: "Configuration table", link: "/reference/configuration" },
      { text: "Relay options", link: "/reference/relay-options" },
      { text: "Migration history", link: "/reference/migration-history" },
    ],
  },
  {
    text: "API by entry point",
    items: [
      { text: "pg-outbox-worker", link: "/api/index/README" },
      { text: "pg-outbox-worker/testing", link: "/api/testing/README" },
      { text: "pg-outbox-worker/inbox", link: "/api/inbox/README" },
    ],
  },
];

const contributing: DefaultTheme.SidebarItem[] = [
  {
    text: "Contributing",
    items: [
      { text: "Layout", link: "/contributing/layout" },
      { text: "Tests", link: "/contributing/tests" },
      { text: "Benchmarks", link: "/contributing/bench" },
      { text: "Migrations", link: "/contributing/migrations" },
      { text: "These docs", link: "/contributing/docs" },
    ],
  },
];

export default defineConfig({
  title: "pg-outbox-worker",
  description: "Transactional outbox for Postgres and TypeScript",
  // Dead links fail the build (VitePress's default, kept on purpose): test/project/docs-site.test.ts relies on it.
  ignoreDeadLinks: false,
  lastUpdated: false,
  markdown: { config: (md) => md.use(repoLinks(docsRoot)) },
  themeConfig: {
    nav: [
      { text: "Guide", link: "/guide/getting-started", activeMatch: "^/guide/" },
      { text: "Operate", link: "/operate/service", activeMatch: "^/operate/" },
      { text: "Reference", link: "/reference/configuration", activeMatch: "^/(reference|api)/" },
      { text: "Contributing", link: "/contributing/layout", activeMatch: "^/contributing/" },
    ],
    sidebar: {
      "/guide/": guide,
      "/operate/": operate,
      "/reference/": reference,
      "/api/": reference,
      "/contributing/": contributing,
    },
    // Built into the site at build time: no network, no third-party service.
    search: { provider: "local" },
    outline: { level: [2, 3] },
  },
  buildEnd(site) {
    const dead = deadBuiltLinks(site.outDir);
    if (dead.length > 0)
      throw new Error(`${dead.length} dead link(s) in the built site:\n${dead.join("\n")}`);
  },
});
