// The page script, served as a file (the CSP allows no inline script); compiled to ES2017 (tsconfig.json
// here).
(() => {
  /** What the page reads of the API's answers (src/console/api.ts). */
  interface QueueRow {
    queue: string;
    ready: number;
    blocked: number;
    scheduled: number;
    leased: number;
    expired: number;
    dead: number;
    oldest_ready_age_s: number | null;
  }
  interface WorkerRow {
    worker: string;
    held: number;
    expired: number;
    oldest_lease_age_s: number | null;
  }
  interface SubscriptionRow {
    pattern: string;
    queues: string[];
  }
  interface Unrouted {
    events: number;
    topics: number;
    byTopic: { topic: string; events: number; oldest_age_s: number | null }[];
  }
  interface Sample {
    ready: number;
    deliveredPerSec: number;
    deadPerSec: number;
  }
  interface Status {
    writable: boolean;
    schema: string;
    now: string;
    queues: QueueRow[];
    workers: WorkerRow[];
    subscriptions: SubscriptionRow[] | null;
    unrouted: Unrouted | null;
    history: { samples?: Sample[] };
  }
  interface Page<R> {
    rows: R[];
    next: string | null;
  }
  interface PeekRow {
    id: string;
    queue: string;
    state: string;
    age_s: number | null;
    deliveries_count: number;
    acquired_by: string | null;
    payload_preview: string | null;
    payload_truncated: boolean;
    payload_bytes: number;
    last_error: string | null;
    last_error_truncated: boolean;
  }
  interface DeadRow {
    id: string;
    queue: string;
    reason: string;
    dead_age_s: number | null;
    payload_preview: string | null;
    payload_truncated: boolean;
    payload_bytes: number;
    error: string | null;
    error_truncated: boolean;
  }
  interface ReplayResult {
    replayed: number;
    skipped: number;
    queues: { queue: string; replayed: number }[];
  }
  interface PurgeResult {
    purged: number;
    queues: { queue: string; purged: number }[];
  }
  interface ReplayFilter {
    ids?: string[];
    queue?: string;
    reason?: string;
    all?: true;
  }
  /** Where a box sits: in a row under a table's row (found by an attribute), or right after an element. */
  type Anchor = { table: string; attr: string; value: string; index: number } | { after: string };
  type BoxName = "notice" | "confirm" | "detail";
  type List = "peek" | "dead";
  type ApiError = Error & { status?: number };

  // Every value from the API is rendered with put (text nodes) or setAttribute, never as markup: payloads,
  // errors and queue names are untrusted text.
  const base = document.body.getAttribute("data-base") || "";
  const TOKEN_KEY = "outbox-console-token";
  const POLL_MS = 3000;
  const SVG = "http://www.w3.org/2000/svg";
  const PAGE_ROWS = 50;
  let writable = false;
  let pending: { action: () => Promise<unknown>; anchor: Anchor } | null = null;

  // The page (src/console/page-html.ts) has every element these look up.
  function $(id: string): HTMLElement {
    return document.getElementById(id) as HTMLElement;
  }
  function input(id: string): HTMLInputElement {
    return $(id) as HTMLInputElement;
  }
  function button(id: string): HTMLButtonElement {
    return $(id) as HTMLButtonElement;
  }
  function table(id: string): HTMLTableElement {
    return $(id) as HTMLTableElement;
  }
  function tableBody(id: string): HTMLTableSectionElement {
    return table(id).tBodies[0] as HTMLTableSectionElement;
  }

  // Bidi controls (LRE, RLE, PDF, LRO, RLO; LRI, RLI, FSI, PDI; LRM, RLM; ALM) reorder the text around
  // them: a right-to-left override in a payload would reverse a cell. Each is shown as a visible mark.
  const cp = String.fromCharCode;
  const BIDI = new RegExp(
    `([${cp(0x202a)}-${cp(0x202e)}${cp(0x2066)}-${cp(0x2069)}${cp(0x200e, 0x200f, 0x061c)}])`,
  );

  function codePoint(ch: string): string {
    let hex = ch.charCodeAt(0).toString(16).toUpperCase();
    while (hex.length < 4) hex = `0${hex}`;
    return `U+${hex}`;
  }

  // The one way text from the API reaches the page: as text nodes, never markup, bidi controls made visible.
  function put<N extends Element>(node: N, value: unknown): N {
    const text = value === undefined || value === null ? "" : String(value);
    const parts = text.split(BIDI);
    if (parts.length === 1) {
      node.textContent = text;
      return node;
    }
    node.replaceChildren(
      ...parts.map((part, i) => {
        if (i % 2 === 0) return document.createTextNode(part);
        const mark = document.createElement("span");
        mark.className = "ctl";
        mark.textContent = `[${codePoint(part)}]`;
        return mark;
      }),
    );
    return node;
  }

  function el<K extends keyof HTMLElementTagNameMap>(
    tag: K,
    text?: unknown,
    cls?: string | null,
  ): HTMLElementTagNameMap[K] {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) put(node, text);
    if (cls) node.className = cls;
    return node;
  }

  function svg(tag: string, attrs: Record<string, string | number>): SVGElement {
    const node = document.createElementNS(SVG, tag);
    for (const k of Object.keys(attrs)) node.setAttribute(k, String(attrs[k]));
    return node;
  }

  // sessionStorage: gone with the tab, never sent by the browser on its own (no cookie, so no CSRF).
  function token(): string {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || "";
    } catch {
      return "";
    }
  }

  function call<T>(method: string, path: string, body?: unknown): Promise<T> {
    const headers: Record<string, string> = { accept: "application/json" };
    const t = token();
    if (t) headers.authorization = `Bearer ${t}`;
    const init: RequestInit = { method, headers, cache: "no-store", credentials: "omit" };
    if (body !== undefined) {
      headers["content-type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(base + path, init).then((res) =>
      res
        .json()
        .catch(() => ({}))
        .then((data: T & { error?: string }) => {
          if (!res.ok) {
            const error: ApiError = new Error(data?.error || `HTTP ${res.status}`);
            error.status = res.status;
            throw error;
          }
          return data;
        }),
    );
  }

  // The notice, confirmation and detail boxes sit beside what they are about: in a row of their own
  // right under the row whose button opened them, or right after a form. The lists are re-rendered on
  // every poll, so each box keeps its anchor and is put back after each render; when its row is gone
  // (replayed, delivered) it stays at the row's place.
  const boxes = {} as Record<BoxName, HTMLElement>;
  const anchors: Partial<Record<BoxName, Anchor | null>> = {};

  function rowAnchor(tableId: string, attr: string, value: unknown): Anchor {
    return { table: tableId, attr, value: String(value), index: 0 };
  }
  function afterAnchor(id: string): Anchor {
    return { after: id };
  }

  function dataRows(tableId: string): HTMLTableRowElement[] {
    return Array.prototype.filter.call(
      tableBody(tableId).rows,
      (r: HTMLTableRowElement) => !r.hasAttribute("data-box"),
    ) as HTMLTableRowElement[];
  }

  function place(name: BoxName): void {
    const box = boxes[name];
    const anchor = anchors[name];
    const holder = box.closest("tr[data-box]");
    if (holder) holder.remove();
    if (!anchor) {
      $("boxes").appendChild(box);
      return;
    }
    if ("after" in anchor) {
      $(anchor.after).after(box);
      return;
    }
    const rows = dataRows(anchor.table);
    let row: HTMLTableRowElement | null = null;
    for (let i = 0; i < rows.length; i++) {
      if (rows[i]?.getAttribute(anchor.attr) === anchor.value) {
        row = rows[i] ?? null;
        anchor.index = i;
        break;
      }
    }
    const tr = el("tr");
    tr.setAttribute("data-box", name);
    const td = el("td", null, "box");
    td.colSpan = (table(anchor.table).tHead as HTMLTableSectionElement).rows[0]?.cells.length ?? 1;
    td.appendChild(box);
    tr.appendChild(td);
    const body = tableBody(anchor.table);
    const before = rows[anchor.index];
    if (row) row.after(tr);
    else if (before) body.insertBefore(tr, before);
    else body.appendChild(tr);
  }

  function show(name: BoxName, anchor: Anchor): void {
    anchors[name] = anchor;
    place(name);
  }

  function hide(name: BoxName): void {
    anchors[name] = null;
    place(name);
  }

  function replaceBoxes(tableId: string): void {
    for (const name of ["confirm", "notice", "detail"] as const) {
      const anchor = anchors[name];
      if (anchor && "table" in anchor && anchor.table === tableId) place(name);
    }
  }

  function notice(text: string, isError: boolean, anchor: Anchor): void {
    const box = boxes.notice;
    put(box, text);
    box.className = isError ? "notice error" : "notice";
    show("notice", anchor);
  }

  function age(seconds: number | null | undefined): string {
    if (seconds === null || seconds === undefined) return "—";
    const s = Math.floor(Number(seconds));
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
    return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
  }

  function size(bytes: number): string {
    if (bytes < 1024) return `${bytes} B`;
    if (bytes < 1048576) return `${(bytes / 1024).toFixed(1)} KB`;
    return `${(bytes / 1048576).toFixed(1)} MB`;
  }

  // A list row carries a preview: the API cut it, the page says so and by how much.
  function preview(text: string | null | undefined, truncated: boolean, bytes: number): string {
    if (text === null || text === undefined) return "";
    return truncated ? `${text}… (${size(bytes)} in all: View)` : text;
  }

  function cell(
    row: HTMLTableRowElement,
    value: unknown,
    cls: string | null,
    col: string,
  ): HTMLTableCellElement {
    const td = el("td", value, cls);
    if (col) td.setAttribute("data-col", col);
    row.appendChild(td);
    return td;
  }

  function fill<R>(
    tableId: string,
    rows: R[],
    columns: number,
    renderRow: (row: R) => HTMLTableRowElement,
    emptyText?: string,
  ): void {
    const body = tableBody(tableId);
    let out = rows.map(renderRow);
    if (out.length === 0) {
      const tr = el("tr");
      const td = el("td", emptyText || "none", "empty");
      td.colSpan = columns;
      tr.appendChild(td);
      out = [tr];
    }
    body.replaceChildren(...out);
    replaceBoxes(tableId);
  }

  function renderQueues(queues: QueueRow[]): void {
    fill("queues", queues, 8, (q) => {
      const tr = el("tr");
      tr.setAttribute("data-queue", q.queue);
      cell(tr, q.queue, "text", "queue");
      for (const k of ["ready", "blocked", "scheduled", "leased", "expired", "dead"] as const) {
        // Expired leases and dead letters need a look: marked when there are any.
        const alarm = (k === "expired" || k === "dead") && q[k] > 0;
        cell(tr, q[k], alarm ? "num alarm" : "num", k);
      }
      cell(tr, age(q.oldest_ready_age_s), "num", "oldest_ready");
      return tr;
    });
  }

  function renderWorkers(workers: WorkerRow[]): void {
    fill("workers", workers, 4, (w) => {
      const tr = el("tr");
      tr.setAttribute("data-worker", w.worker);
      cell(tr, w.worker, "text", "worker");
      cell(tr, w.held, "num", "held");
      cell(tr, w.expired, "num", "expired");
      cell(tr, age(w.oldest_lease_age_s), "num", "oldest_lease");
      return tr;
    });
  }

  const NO_SUBSCRIBERS = "no_subscribers";

  function renderSubscriptions(subscriptions: SubscriptionRow[] | null | undefined): void {
    if (subscriptions === null || subscriptions === undefined) {
      // Not the same as none: this role may not read the table.
      const tr = el("tr");
      const td = el(
        "td",
        "not shown: the console's database role may not read the subscriptions table",
        "empty",
      );
      td.colSpan = 2;
      tr.appendChild(td);
      tableBody("subscriptions").replaceChildren(tr);
      return;
    }
    fill("subscriptions", subscriptions, 2, (s) => {
      const tr = el("tr");
      tr.setAttribute("data-pattern", s.pattern);
      cell(tr, s.pattern, "text", "pattern");
      cell(tr, s.queues.join(", "), "text", "queues");
      return tr;
    });
  }

  function showUnrouted(topic: string): void {
    input("dead-queue").value = topic;
    input("dead-reason").value = NO_SUBSCRIBERS;
    firstPage("dead");
    refresh();
    $("dead").scrollIntoView();
  }

  function renderUnrouted(unrouted: Unrouted | null | undefined): void {
    const kept = unrouted || { events: 0, topics: 0, byTopic: [] };
    fill("unrouted", kept.byTopic, 4, (t) => {
      const tr = el("tr");
      tr.setAttribute("data-topic", t.topic);
      cell(tr, t.topic, "text", "topic");
      cell(tr, t.events, "num alarm", "events");
      cell(tr, age(t.oldest_age_s), "num", "oldest");
      const actions = cell(tr, null, null, "actions");
      const list = el("button", "List");
      list.type = "button";
      list.setAttribute("data-action", "list");
      list.addEventListener("click", () => {
        showUnrouted(t.topic);
      });
      const replay = el("button", "Replay…", "write");
      replay.type = "button";
      replay.setAttribute("data-action", "replay");
      replay.disabled = !writable;
      replay.addEventListener("click", () => {
        askReplay({ queue: t.topic, reason: NO_SUBSCRIBERS }, rowAnchor("unrouted", "data-topic", t.topic));
      });
      actions.append(list, " ", replay);
      return tr;
    });
    const note = $("unrouted-note");
    const more = kept.topics - kept.byTopic.length;
    put(
      note,
      kept.events === 0
        ? ""
        : `${kept.events} event${kept.events === 1 ? "" : "s"} kept` +
            (more > 0 ? ` (the ${kept.byTopic.length} topics with most shown, ${more} more)` : "") +
            ". Subscribe a queue to the topic, then replay: each goes to the topic's subscribers of that moment.",
    );
    note.hidden = kept.events === 0;
  }

  function line(
    samples: Sample[],
    key: keyof Sample,
    max: number,
    w: number,
    h: number,
    cls: string,
  ): SVGElement {
    const span = Math.max(samples.length - 1, 1);
    const points = samples.map((s, i) => {
      const x = (i / span) * w;
      const y = h - (max > 0 ? (Number(s[key]) / max) * (h - 16) : 0);
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    });
    return svg("polyline", { points: points.join(" "), class: cls });
  }

  function renderChart(history: Status["history"]): void {
    const samples = history.samples || [];
    const w = 600;
    const h = 150;
    const root = svg("svg", { viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: "none", role: "img" });
    root.appendChild(svg("line", { x1: 0, y1: h - 0.5, x2: w, y2: h - 0.5, class: "axis" }));
    if (samples.length < 2) {
      put($("chart-scale"), "collecting samples… ");
    } else {
      const maxReady = Math.max(...samples.map((s) => s.ready));
      const maxRate = Math.max(...samples.map((s) => Math.max(s.deliveredPerSec, s.deadPerSec)));
      root.appendChild(line(samples, "ready", maxReady, w, h, "ready"));
      root.appendChild(line(samples, "deliveredPerSec", maxRate, w, h, "delivered"));
      root.appendChild(line(samples, "deadPerSec", maxRate, w, h, "dead"));
      // Outside the SVG: its aspect ratio is not kept, which would stretch text.
      put($("chart-scale"), `scale: ready up to ${maxReady}, rates up to ${maxRate.toFixed(1)}/s ·`);
    }
    $("chart").replaceChildren(root);
  }

  // Keyset pages: the cursor of the page shown, and the cursors of the pages before it for "previous".
  // asked counts requests: an answer is drawn only if no request was sent after it (a poll's answer that
  // lands after a click on Next must not put the old page back).
  interface PageState {
    cursor: string | null;
    back: (string | null)[];
    next: string | null;
    param: string;
    asked: number;
  }
  const pages: Record<List, PageState> = {
    peek: { cursor: null, back: [], next: null, param: "after", asked: 0 },
    dead: { cursor: null, back: [], next: null, param: "before", asked: 0 },
  };

  function loadPage<R>(
    list: List,
    path: string,
    fields: Record<string, string>,
    render: (page: Page<R>) => void,
  ): Promise<void> {
    const ticket = ++pages[list].asked;
    return call<Page<R>>("GET", `${path}?${listQuery(list, fields)}`).then((page) => {
      if (ticket === pages[list].asked) render(page);
    });
  }

  function renderPager(list: List, page: Page<{ id: string }>): void {
    const state = pages[list];
    state.next = page.next;
    const rows = page.rows;
    const span = rows.length ? `: ids ${rows[0]?.id} to ${rows[rows.length - 1]?.id}` : "";
    put($(`${list}-page`), `page ${state.back.length + 1}${span}`);
    button(`${list}-first`).disabled = state.cursor === null;
    button(`${list}-prev`).disabled = state.cursor === null;
    button(`${list}-next`).disabled = state.next === null;
  }

  function firstPage(list: List): void {
    pages[list].cursor = null;
    pages[list].back = [];
  }

  function viewButton(onClick: () => void): HTMLButtonElement {
    const view = el("button", "View");
    view.type = "button";
    view.setAttribute("data-action", "view");
    view.addEventListener("click", onClick);
    return view;
  }

  function renderPeek(page: Page<PeekRow>): void {
    renderPager("peek", page);
    const empty =
      pages.peek.cursor === null ? "none" : "none on this page (delivered since?): go to the first page";
    fill(
      "peek",
      page.rows,
      9,
      (m) => {
        const tr = el("tr");
        tr.setAttribute("data-id", m.id);
        cell(tr, m.id, "num", "id");
        cell(tr, m.queue, "text", "queue");
        cell(tr, m.state, null, "state");
        cell(tr, age(m.age_s), "num", "age");
        cell(tr, m.deliveries_count, "num", "deliveries");
        cell(tr, m.acquired_by || "", "text", "acquired_by");
        cell(tr, preview(m.payload_preview, m.payload_truncated, m.payload_bytes), "text", "payload");
        cell(tr, m.last_error_truncated ? `${m.last_error}…` : m.last_error || "", "text", "last_error");
        const actions = cell(tr, null, null, "actions");
        actions.append(
          viewButton(() => {
            showDetail("/api/messages/", "Message", m.id, rowAnchor("peek", "data-id", m.id));
          }),
        );
        return tr;
      },
      empty,
    );
  }

  function renderDead(page: Page<DeadRow>): void {
    renderPager("dead", page);
    const empty = pages.dead.cursor === null ? "none" : "none on this page: go to the first page";
    fill(
      "dead",
      page.rows,
      7,
      (d) => {
        const tr = el("tr");
        tr.setAttribute("data-id", d.id);
        cell(tr, d.id, "num", "id");
        cell(tr, d.queue, "text", "queue");
        cell(tr, d.reason, "text", "reason");
        cell(tr, `${age(d.dead_age_s)} ago`, "num", "died");
        cell(tr, preview(d.payload_preview, d.payload_truncated, d.payload_bytes), "text", "payload");
        cell(tr, d.error_truncated ? `${d.error}…` : d.error || "", "text", "error");
        const actions = cell(tr, null, null, "actions");
        const anchor = rowAnchor("dead", "data-id", d.id);
        const replay = el("button", "Replay…", "write");
        replay.type = "button";
        replay.setAttribute("data-action", "replay");
        replay.disabled = !writable;
        replay.addEventListener("click", () => {
          askReplay({ ids: [String(d.id)] }, anchor);
        });
        actions.append(
          viewButton(() => {
            showDetail("/api/dead-letters/", "Dead letter", d.id, anchor);
          }),
          " ",
          replay,
        );
        return tr;
      },
      empty,
    );
  }

  // The whole record, asked for when wanted: the lists only carry previews.
  function showDetail(path: string, title: string, id: string, anchor: Anchor): void {
    call<{ id: string }>("GET", path + encodeURIComponent(id)).then(
      (row) => {
        put($("detail-title"), `${title} #${row.id}`);
        put($("detail-body"), JSON.stringify(row, null, 2));
        show("detail", anchor);
      },
      (e: Error) => {
        notice(e.message, true, anchor);
      },
    );
  }

  function listQuery(list: List, fields: Record<string, string>): URLSearchParams {
    const params = new URLSearchParams();
    for (const name of Object.keys(fields)) {
      const value = input(fields[name] as string).value.trim();
      if (value) params.set(name, value);
    }
    params.set("limit", String(PAGE_ROWS));
    const cursor = pages[list].cursor;
    if (cursor !== null) params.set(pages[list].param, cursor);
    return params;
  }

  function refresh(): Promise<void> {
    return Promise.all([
      call<Status>("GET", "/api/status").then((s) => {
        writable = s.writable;
        put($("schema"), `schema ${s.schema}`);
        renderQueues(s.queues);
        renderWorkers(s.workers);
        renderSubscriptions(s.subscriptions);
        renderUnrouted(s.unrouted);
        renderChart(s.history);
        for (const b of Array.prototype.slice.call(
          document.querySelectorAll("button.write"),
        ) as HTMLButtonElement[]) {
          b.disabled = !writable;
        }
        put(
          $("status-line"),
          `updated ${new Date(s.now).toLocaleTimeString()}${writable ? "" : " · read-only (no write token configured)"}`,
        );
        $("status-line").className = "muted";
      }),
      loadPage("peek", "/api/peek", { queue: "peek-queue", state: "peek-state" }, renderPeek),
      loadPage("dead", "/api/dead-letters", { queue: "dead-queue", reason: "dead-reason" }, renderDead),
    ]).then(
      () => {},
      (e: ApiError) => {
        // The rows shown stay: a database outage (503) names the database, and the next poll tries again.
        put(
          $("status-line"),
          e.status === 401 || e.status === 403
            ? `${e.message}: enter a token above`
            : (e.status === 503 ? "" : "refresh failed: ") + e.message,
        );
        $("status-line").className = "muted alarm";
      },
    );
  }

  function plural(n: number): string {
    return `${n} dead letter${n === 1 ? "" : "s"}`;
  }

  function confirmBox(
    text: string,
    queues: { label: string; n: number }[],
    anchor: Anchor,
    onYes: () => Promise<unknown>,
  ): void {
    put($("confirm-text"), text);
    $("confirm-queues").replaceChildren(...queues.map((q) => el("li", `${q.label}: ${q.n}`)));
    pending = { action: onYes, anchor };
    button("confirm-yes").disabled = false;
    show("confirm", anchor);
    button("confirm-yes").focus({ preventScroll: true });
  }

  function closeConfirm(): void {
    pending = null;
    hide("confirm");
  }

  // Why replay leaves a dead letter: its id is back in messages, or (kept for want of a subscriber) its
  // topic still has none.
  function skipReason(filter: ReplayFilter): string {
    if (filter.reason === NO_SUBSCRIBERS) return "their topic has no subscriber yet";
    if (filter.reason) return "a message with the same id exists";
    return "a message with the same id exists, or their topic has no subscriber yet";
  }

  function askReplay(filter: ReplayFilter, anchor: Anchor): void {
    hide("notice");
    const why = skipReason(filter);
    const kind = filter.reason === NO_SUBSCRIBERS ? "topic " : "queue ";
    call<ReplayResult>("POST", "/api/dead-letters/replay", Object.assign({ dryRun: true }, filter)).then(
      (r) => {
        if (r.replayed === 0) {
          notice(`Nothing to replay${r.skipped ? ` (${r.skipped} skipped: ${why})` : ""}.`, false, anchor);
          return;
        }
        const text = `This will replay ${plural(r.replayed)} into messages, ready now${
          r.skipped ? `; ${r.skipped} will be skipped (${why})` : ""
        }.`;
        confirmBox(
          text,
          r.queues.filter((q) => q.replayed > 0).map((q) => ({ label: kind + q.queue, n: q.replayed })),
          anchor,
          () =>
            call<ReplayResult>("POST", "/api/dead-letters/replay", filter).then((done) => {
              notice(
                `Replayed ${plural(done.replayed)}${done.skipped ? `, skipped ${done.skipped}` : ""}.`,
                false,
                anchor,
              );
            }),
        );
      },
      (e: Error) => {
        notice(e.message, true, anchor);
      },
    );
  }

  function askPurge(): void {
    const anchor = afterAnchor("purge-form");
    hide("notice");
    const body: { olderThan: string; queue?: string } = { olderThan: input("purge-older").value.trim() };
    const queue = input("purge-queue").value.trim();
    if (queue) body.queue = queue;
    call<PurgeResult>("POST", "/api/dead-letters/purge", Object.assign({ dryRun: true }, body)).then(
      (r) => {
        if (r.purged === 0) {
          notice(
            `No dead letter is older than ${body.olderThan}${queue ? ` in queue ${queue}` : ""}.`,
            false,
            anchor,
          );
          return;
        }
        confirmBox(
          `This will delete ${plural(r.purged)} older than ${body.olderThan}, for good.`,
          r.queues.map((q) => ({ label: `queue ${q.queue}`, n: q.purged })),
          anchor,
          () =>
            call<PurgeResult>("POST", "/api/dead-letters/purge", body).then((done) => {
              notice(`Purged ${plural(done.purged)}.`, false, anchor);
            }),
        );
      },
      (e: Error) => {
        notice(e.message, true, anchor);
      },
    );
  }

  function pagerControls(list: List): void {
    const state = pages[list];
    $(`${list}-next`).addEventListener("click", () => {
      if (state.next === null) return;
      state.back.push(state.cursor);
      state.cursor = state.next;
      refresh();
    });
    $(`${list}-prev`).addEventListener("click", () => {
      if (state.cursor === null) return;
      const previous = state.back.pop();
      state.cursor = previous === undefined ? null : previous;
      refresh();
    });
    $(`${list}-first`).addEventListener("click", () => {
      firstPage(list);
      refresh();
    });
  }

  function start(): void {
    for (const name of ["notice", "confirm", "detail"] as const) boxes[name] = $(name);
    $("boxes").hidden = true;
    input("token").value = token();
    $("token-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      try {
        sessionStorage.setItem(TOKEN_KEY, input("token").value.trim());
      } catch {
        /* private mode */
      }
      refresh();
    });
    $("token-clear").addEventListener("click", () => {
      try {
        sessionStorage.removeItem(TOKEN_KEY);
      } catch {
        /* private mode */
      }
      input("token").value = "";
      refresh();
    });
    // A new filter starts from the first page: the old cursor belongs to another list.
    $("peek-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      firstPage("peek");
      refresh();
    });
    $("dead-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      firstPage("dead");
      refresh();
    });
    pagerControls("peek");
    pagerControls("dead");
    $("replay-matching").addEventListener("click", () => {
      const queue = input("dead-queue").value.trim();
      const reason = input("dead-reason").value.trim();
      const filter: ReplayFilter = {};
      if (queue) filter.queue = queue;
      if (reason) filter.reason = reason;
      // No filter: every dead letter, which the API only takes when asked for by name.
      askReplay(queue || reason ? filter : { all: true }, afterAnchor("dead-form"));
    });
    $("purge-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      askPurge();
    });
    $("confirm-no").addEventListener("click", closeConfirm);
    $("confirm-yes").addEventListener("click", () => {
      const asked = pending;
      if (!asked) return;
      button("confirm-yes").disabled = true;
      asked.action().then(
        () => {
          closeConfirm();
          return refresh();
        },
        (e: Error) => {
          closeConfirm();
          notice(e.message, true, asked.anchor);
        },
      );
    });
    $("detail-close").addEventListener("click", () => {
      hide("detail");
    });
    refresh();
    setInterval(() => {
      if (!document.hidden) refresh();
    }, POLL_MS);
  }

  start();
})();
