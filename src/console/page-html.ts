/** For the one value the shell interpolates (the prefix, validated to a plain path): escaped regardless. */
export function escapeHtml(text: string): string {
  return text.replace(
    /[&<>"']/g,
    (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c] as string,
  );
}

/** Page controls under a list: keyset pages, so "previous" walks back the cursors the page went through. */
function pager(list: string, nextLabel: string): string {
  return `<div class="pager" id="${list}-pager">
    <button type="button" id="${list}-first">« First</button>
    <button type="button" id="${list}-prev">‹ Previous</button>
    <span id="${list}-page" class="muted"></span>
    <button type="button" id="${list}-next">${nextLabel}</button>
  </div>`;
}

/**
 * The page's static shell: no data in it (the script fetches everything and renders it as text), so it
 * is the same for every viewer and needs no token. The notice, confirmation and detail boxes wait in
 * #boxes until the script moves one beside the row or form it belongs to.
 */
export function consoleHtml(pathPrefix: string): string {
  const base = escapeHtml(pathPrefix);
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Outbox console</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="${base}/console.css">
<script src="${base}/console.js" defer></script>
<script src="${base}/relays.js" defer></script>
</head>
<body data-base="${base}">
<header>
  <h1>Outbox console <span id="schema" class="muted"></span></h1>
  <div id="status-line" class="muted" role="status">loading…</div>
  <form id="token-form" class="token" autocomplete="off">
    <label for="token">Token</label>
    <input id="token" type="password" placeholder="read or write token" spellcheck="false">
    <button type="submit" id="token-save">Use</button>
    <button type="button" id="token-clear">Forget</button>
  </form>
</header>
<main>
<section>
  <h2>Queues</h2>
  <table id="queues">
    <thead><tr><th>Queue</th><th>Ready</th><th>Blocked</th><th>Scheduled</th><th>Leased</th><th>Expired leases</th><th>Dead letters</th><th>Oldest ready</th></tr></thead>
    <tbody></tbody>
  </table>
</section>
<section>
  <h2>Backlog and throughput <span class="muted">(last 10 minutes)</span></h2>
  <div id="chart" class="chart"></div>
  <p class="legend"><span id="chart-scale"></span><span class="key ready"></span>ready backlog <span class="key delivered"></span>delivered / s <span class="key dead"></span>dead-lettered / s</p>
</section>
<section>
  <h2>Workers holding leases</h2>
  <table id="workers">
    <thead><tr><th>Worker (acquired_by)</th><th>Rows held</th><th>Expired</th><th>Oldest lease</th></tr></thead>
    <tbody></tbody>
  </table>
</section>
<section>
  <h2>Topics</h2>
  <table id="subscriptions">
    <thead><tr><th>Topic pattern</th><th>Subscribed queues</th></tr></thead>
    <tbody></tbody>
  </table>
  <h3>Events no queue subscribed to <span class="muted">(kept as dead letters no_subscribers)</span></h3>
  <table id="unrouted">
    <thead><tr><th>Topic</th><th>Events</th><th>Oldest</th><th></th></tr></thead>
    <tbody></tbody>
  </table>
  <p id="unrouted-note" class="muted" hidden></p>
</section>
<section>
  <h2>Unprocessed <span class="muted">(by id, oldest first)</span></h2>
  <form id="peek-form" class="filters">
    <input id="peek-queue" placeholder="queue">
    <select id="peek-state"><option value="">any state</option><option>ready</option><option>blocked</option><option>scheduled</option><option>leased</option><option value="lease_expired">lease expired</option></select>
    <button type="submit">Filter</button>
  </form>
  <table id="peek">
    <thead><tr><th>Id</th><th>Queue</th><th>State</th><th>Age</th><th>Deliveries</th><th>Acquired by</th><th>Payload</th><th>Last error</th><th></th></tr></thead>
    <tbody></tbody>
  </table>
  ${pager("peek", "Next (newer) ›")}
</section>
<section>
  <h2>Dead letters <span class="muted">(by id, newest first)</span></h2>
  <form id="dead-form" class="filters">
    <input id="dead-queue" placeholder="queue">
    <input id="dead-reason" placeholder="reason">
    <button type="submit">Filter</button>
    <button type="button" id="replay-matching" class="write">Replay all matching…</button>
  </form>
  <form id="purge-form" class="filters">
    <label for="purge-older">Purge older than</label>
    <input id="purge-older" value="7d" size="6">
    <input id="purge-queue" placeholder="queue (optional)">
    <button type="submit" class="write danger">Purge…</button>
  </form>
  <table id="dead">
    <thead><tr><th>Id</th><th>Queue</th><th>Reason</th><th>Died</th><th>Payload</th><th>Error</th><th></th></tr></thead>
    <tbody></tbody>
  </table>
  ${pager("dead", "Next (older) ›")}
</section>
<section>
  <h2>Relays <span class="muted">(whether each built-in relay reaches its broker; not part of readiness)</span></h2>
  <table id="relays">
    <thead><tr><th>Queue</th><th>Type</th><th>State</th><th>Target</th><th>Last error</th></tr></thead>
    <tbody></tbody>
  </table>
  <p id="relays-note" class="muted"></p>
</section>
</main>
<div id="boxes" hidden>
  <div id="notice" class="notice" role="alert"></div>
  <div id="confirm" class="confirm" aria-live="assertive">
    <p id="confirm-text"></p>
    <ul id="confirm-queues"></ul>
    <button type="button" id="confirm-yes" class="danger">Confirm</button>
    <button type="button" id="confirm-no">Cancel</button>
  </div>
  <div id="detail" class="detail">
    <h3><span id="detail-title"></span> <button type="button" id="detail-close">Close</button></h3>
    <pre id="detail-body"></pre>
  </div>
</div>
</body>
</html>
`;
}
