// The relay panel's script, its own file beside console.js; compiled to ES2017 (tsconfig.json here).
(() => {
  interface RelayReport {
    relays?: Record<string, { type: string; state: string; target?: string; error?: string }>;
  }

  const base = document.body.getAttribute("data-base") || "";
  const POLL_MS = 3000;
  const cp = String.fromCharCode;
  // Bidi controls (LRM, RLM, ALM, embeddings, overrides, isolates) could reorder a cell's text: shown as
  // their code point instead.
  const BIDI = new RegExp(
    `[${cp(0x061c, 0x200e, 0x200f)}${cp(0x202a)}-${cp(0x202e)}${cp(0x2066)}-${cp(0x2069)}]`,
    "g",
  );

  function note(): HTMLElement {
    return document.getElementById("relays-note") as HTMLElement;
  }

  function visible(text: unknown): string {
    return String(text).replace(BIDI, (c) => `[U+${c.charCodeAt(0).toString(16).toUpperCase()}]`);
  }

  function cell(tr: HTMLTableRowElement, text: unknown, cls: string | null, col: string): void {
    const td = document.createElement("td");
    td.textContent = visible(text);
    if (cls) td.className = cls;
    td.setAttribute("data-col", col);
    tr.appendChild(td);
  }

  function token(): string {
    try {
      return sessionStorage.getItem("outbox-console-token") || "";
    } catch {
      return "";
    }
  }

  function render(report: RelayReport): void {
    const body = (document.getElementById("relays") as HTMLTableElement)
      .tBodies[0] as HTMLTableSectionElement;
    const relays = report.relays || {};
    let rows = Object.keys(relays)
      .sort()
      .map((queue) => {
        const r = relays[queue] as NonNullable<(typeof relays)[string]>;
        const tr = document.createElement("tr");
        tr.setAttribute("data-queue", queue);
        cell(tr, queue, "text", "queue");
        cell(tr, r.type, null, "type");
        cell(tr, r.state, r.state === "ok" ? null : "alarm", "state");
        cell(tr, r.target || "", "text", "target");
        cell(tr, r.error || "", "text", "error");
        return tr;
      });
    if (rows.length === 0) {
      const tr = document.createElement("tr");
      const td = document.createElement("td");
      td.textContent = "none: this service has no built-in relay";
      td.className = "empty";
      td.colSpan = 5;
      tr.appendChild(td);
      rows = [tr];
    }
    body.replaceChildren(...rows);
    note().textContent = "";
  }

  function refresh(): void {
    const headers: Record<string, string> = { accept: "application/json" };
    const t = token();
    if (t) headers.authorization = `Bearer ${t}`;
    fetch(`${base}/api/relays`, { headers, cache: "no-store", credentials: "omit" })
      .then((res) =>
        res
          .json()
          .catch(() => ({}))
          .then((data: RelayReport & { error?: string }) => {
            if (!res.ok) throw new Error(data?.error || `HTTP ${res.status}`);
            render(data);
          }),
      )
      .catch((e: Error) => {
        note().textContent = `relays not shown: ${visible(e.message)}`;
      });
  }

  refresh();
  setInterval(() => {
    if (!document.hidden) refresh();
  }, POLL_MS);
})();
