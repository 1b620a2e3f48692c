/**
 * The page script: plain ES2017, no build step; served as a file (the CSP allows no inline script). It
 * sits in a template literal, so it holds no backtick, no dollar-brace and no backslash escape.
 */
export const CONSOLE_SCRIPT = `
(function () {
  "use strict";
  // Every value from the API is rendered with put (text nodes) or setAttribute, never as markup: payloads,
  // errors and queue names are untrusted text.
  var base = document.body.getAttribute("data-base") || "";
  var TOKEN_KEY = "outbox-console-token";
  var POLL_MS = 3000;
  var SVG = "http://www.w3.org/2000/svg";
  var PAGE_ROWS = 50;
  var writable = false;
  var pending = null;
  var timer = null;

  function $(id) { return document.getElementById(id); }

  // Bidi controls (LRE, RLE, PDF, LRO, RLO; LRI, RLI, FSI, PDI; LRM, RLM; ALM) reorder the text around
  // them: a right-to-left override in a payload would reverse a cell. Each is shown as a visible mark.
  var BIDI = new RegExp("([" + String.fromCharCode(0x202A) + "-" + String.fromCharCode(0x202E) +
    String.fromCharCode(0x2066) + "-" + String.fromCharCode(0x2069) +
    String.fromCharCode(0x200E, 0x200F, 0x061C) + "])");

  function codePoint(ch) {
    var hex = ch.charCodeAt(0).toString(16).toUpperCase();
    while (hex.length < 4) hex = "0" + hex;
    return "U+" + hex;
  }

  // The one way text from the API reaches the page: as text nodes, never markup, bidi controls made visible.
  function put(node, value) {
    var text = value === undefined || value === null ? "" : String(value);
    var parts = text.split(BIDI);
    if (parts.length === 1) {
      node.textContent = text;
      return node;
    }
    node.replaceChildren.apply(node, parts.map(function (part, i) {
      if (i % 2 === 0) return document.createTextNode(part);
      var mark = document.createElement("span");
      mark.className = "ctl";
      mark.textContent = "[" + codePoint(part) + "]";
      return mark;
    }));
    return node;
  }

  function el(tag, text, cls) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) put(node, text);
    if (cls) node.className = cls;
    return node;
  }

  function svg(tag, attrs) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, String(attrs[k])); });
    return node;
  }

  // sessionStorage: gone with the tab, never sent by the browser on its own (no cookie, so no CSRF).
  function token() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ""; }
  }

  function call(method, path, body) {
    var headers = { accept: "application/json" };
    var t = token();
    if (t) headers.authorization = "Bearer " + t;
    var init = { method: method, headers: headers, cache: "no-store", credentials: "omit" };
    if (body !== undefined) {
      headers["content-type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(base + path, init).then(function (res) {
      return res.json().catch(function () { return {}; }).then(function (data) {
        if (!res.ok) {
          var error = new Error((data && data.error) || "HTTP " + res.status);
          error.status = res.status;
          throw error;
        }
        return data;
      });
    });
  }

  // The notice, confirmation and detail boxes sit beside what they are about: in a row of their own
  // right under the row whose button opened them, or right after a form. The lists are re-rendered on
  // every poll, so each box keeps its anchor and is put back after each render; when its row is gone
  // (replayed, delivered) it stays at the row's place.
  var boxes = {};
  var anchors = {};

  function rowAnchor(table, attr, value) { return { table: table, attr: attr, value: String(value), index: 0 }; }
  function afterAnchor(id) { return { after: id }; }

  function dataRows(table) {
    return Array.prototype.filter.call($(table).tBodies[0].rows, function (r) { return !r.hasAttribute("data-box"); });
  }

  function place(name) {
    var box = boxes[name];
    var anchor = anchors[name];
    var holder = box.closest("tr[data-box]");
    if (holder) holder.remove();
    if (!anchor) {
      $("boxes").appendChild(box);
      return;
    }
    if (anchor.after) {
      $(anchor.after).after(box);
      return;
    }
    var rows = dataRows(anchor.table);
    var row = null;
    for (var i = 0; i < rows.length; i++) {
      if (rows[i].getAttribute(anchor.attr) === anchor.value) { row = rows[i]; anchor.index = i; break; }
    }
    var tr = el("tr");
    tr.setAttribute("data-box", name);
    var td = el("td", null, "box");
    td.colSpan = $(anchor.table).tHead.rows[0].cells.length;
    td.appendChild(box);
    tr.appendChild(td);
    var body = $(anchor.table).tBodies[0];
    if (row) row.after(tr);
    else if (rows[anchor.index]) body.insertBefore(tr, rows[anchor.index]);
    else body.appendChild(tr);
  }

  function show(name, anchor) {
    anchors[name] = anchor;
    place(name);
  }

  function hide(name) {
    anchors[name] = null;
    place(name);
  }

  function replaceBoxes(table) {
    ["confirm", "notice", "detail"].forEach(function (name) {
      if (anchors[name] && anchors[name].table === table) place(name);
    });
  }

  function notice(text, isError, anchor) {
    var box = boxes.notice;
    put(box, text);
    box.className = isError ? "notice error" : "notice";
    show("notice", anchor);
  }

  function age(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    var s = Math.floor(Number(seconds));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
    return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
  }

  function size(bytes) {
    if (bytes < 1024) return bytes + " B";
    if (bytes < 1048576) return (bytes / 1024).toFixed(1) + " KB";
    return (bytes / 1048576).toFixed(1) + " MB";
  }

  // A list row carries a preview: the API cut it, the page says so and by how much.
  function preview(text, truncated, bytes) {
    if (text === null || text === undefined) return "";
    return truncated ? text + "… (" + size(bytes) + " in all: View)" : text;
  }

  function cell(row, value, cls, col) {
    var td = el("td", value, cls);
    if (col) td.setAttribute("data-col", col);
    row.appendChild(td);
    return td;
  }

  function fill(tableId, rows, columns, renderRow, emptyText) {
    var body = $(tableId).tBodies[0];
    var out = rows.map(renderRow);
    if (out.length === 0) {
      var tr = el("tr");
      var td = el("td", emptyText || "none", "empty");
      td.colSpan = columns;
      tr.appendChild(td);
      out = [tr];
    }
    body.replaceChildren.apply(body, out);
    replaceBoxes(tableId);
  }

  function renderQueues(queues) {
    fill("queues", queues, 8, function (q) {
      var tr = el("tr");
      tr.setAttribute("data-queue", q.queue);
      cell(tr, q.queue, "text", "queue");
      ["ready", "blocked", "scheduled", "leased", "expired", "dead"].forEach(function (k) {
        // Expired leases and dead letters need a look: marked when there are any.
        var alarm = (k === "expired" || k === "dead") && q[k] > 0;
        cell(tr, q[k], alarm ? "num alarm" : "num", k);
      });
      cell(tr, age(q.oldest_ready_age_s), "num", "oldest_ready");
      return tr;
    });
  }

  function renderWorkers(workers) {
    fill("workers", workers, 4, function (w) {
      var tr = el("tr");
      tr.setAttribute("data-worker", w.worker);
      cell(tr, w.worker, "text", "worker");
      cell(tr, w.held, "num", "held");
      cell(tr, w.expired, "num", "expired");
      cell(tr, age(w.oldest_lease_age_s), "num", "oldest_lease");
      return tr;
    });
  }

  var NO_SUBSCRIBERS = "no_subscribers";

  function renderSubscriptions(subscriptions) {
    if (subscriptions === null || subscriptions === undefined) {
      // Not the same as none: this role may not read the table.
      var tr = el("tr");
      var td = el("td", "not shown: the console's database role may not read the subscriptions table", "empty");
      td.colSpan = 2;
      tr.appendChild(td);
      $("subscriptions").tBodies[0].replaceChildren(tr);
      return;
    }
    fill("subscriptions", subscriptions, 2, function (s) {
      var tr = el("tr");
      tr.setAttribute("data-pattern", s.pattern);
      cell(tr, s.pattern, "text", "pattern");
      cell(tr, s.queues.join(", "), "text", "queues");
      return tr;
    });
  }

  function showUnrouted(topic) {
    $("dead-queue").value = topic;
    $("dead-reason").value = NO_SUBSCRIBERS;
    firstPage("dead");
    refresh();
    $("dead").scrollIntoView();
  }

  function renderUnrouted(unrouted) {
    var kept = unrouted || { events: 0, topics: 0, byTopic: [] };
    fill("unrouted", kept.byTopic, 4, function (t) {
      var tr = el("tr");
      tr.setAttribute("data-topic", t.topic);
      cell(tr, t.topic, "text", "topic");
      cell(tr, t.events, "num alarm", "events");
      cell(tr, age(t.oldest_age_s), "num", "oldest");
      var actions = cell(tr, null, null, "actions");
      var list = el("button", "List");
      list.type = "button";
      list.setAttribute("data-action", "list");
      list.addEventListener("click", function () { showUnrouted(t.topic); });
      var replay = el("button", "Replay…", "write");
      replay.type = "button";
      replay.setAttribute("data-action", "replay");
      replay.disabled = !writable;
      replay.addEventListener("click", function () {
        askReplay({ queue: t.topic, reason: NO_SUBSCRIBERS }, rowAnchor("unrouted", "data-topic", t.topic));
      });
      actions.append(list, " ", replay);
      return tr;
    });
    var note = $("unrouted-note");
    var more = kept.topics - kept.byTopic.length;
    put(note, kept.events === 0 ? "" :
      kept.events + " event" + (kept.events === 1 ? "" : "s") + " kept" +
      (more > 0 ? " (the " + kept.byTopic.length + " topics with most shown, " + more + " more)" : "") +
      ". Subscribe a queue to the topic, then replay: each goes to the topic's subscribers of that moment.");
    note.hidden = kept.events === 0;
  }

  function line(samples, key, max, w, h, cls) {
    var span = Math.max(samples.length - 1, 1);
    var points = samples.map(function (s, i) {
      var x = (i / span) * w;
      var y = h - (max > 0 ? (Number(s[key]) / max) * (h - 16) : 0);
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    return svg("polyline", { points: points.join(" "), class: cls });
  }

  function renderChart(history) {
    var samples = history.samples || [];
    var w = 600;
    var h = 150;
    var root = svg("svg", { viewBox: "0 0 " + w + " " + h, preserveAspectRatio: "none", role: "img" });
    root.appendChild(svg("line", { x1: 0, y1: h - 0.5, x2: w, y2: h - 0.5, class: "axis" }));
    if (samples.length < 2) {
      put($("chart-scale"), "collecting samples… ");
    } else {
      var maxReady = Math.max.apply(null, samples.map(function (s) { return s.ready; }));
      var maxRate = Math.max.apply(null, samples.map(function (s) { return Math.max(s.deliveredPerSec, s.deadPerSec); }));
      root.appendChild(line(samples, "ready", maxReady, w, h, "ready"));
      root.appendChild(line(samples, "deliveredPerSec", maxRate, w, h, "delivered"));
      root.appendChild(line(samples, "deadPerSec", maxRate, w, h, "dead"));
      // Outside the SVG: its aspect ratio is not kept, which would stretch text.
      put($("chart-scale"), "scale: ready up to " + maxReady + ", rates up to " + maxRate.toFixed(1) + "/s ·");
    }
    $("chart").replaceChildren(root);
  }

  // Keyset pages: the cursor of the page shown, and the cursors of the pages before it for "previous".
  // asked counts requests: an answer is drawn only if no request was sent after it (a poll's answer that
  // lands after a click on Next must not put the old page back).
  var pages = {
    peek: { cursor: null, back: [], next: null, param: "after", asked: 0 },
    dead: { cursor: null, back: [], next: null, param: "before", asked: 0 },
  };

  function loadPage(list, path, fields, render) {
    var ticket = ++pages[list].asked;
    return call("GET", path + "?" + listQuery(list, fields)).then(function (page) {
      if (ticket === pages[list].asked) render(page);
    });
  }

  function renderPager(list, page) {
    var state = pages[list];
    state.next = page.next;
    var rows = page.rows;
    var span = rows.length ? ": ids " + rows[0].id + " to " + rows[rows.length - 1].id : "";
    put($(list + "-page"), "page " + (state.back.length + 1) + span);
    $(list + "-first").disabled = state.cursor === null;
    $(list + "-prev").disabled = state.cursor === null;
    $(list + "-next").disabled = state.next === null;
  }

  function firstPage(list) {
    pages[list].cursor = null;
    pages[list].back = [];
  }

  function viewButton(onClick) {
    var view = el("button", "View");
    view.type = "button";
    view.setAttribute("data-action", "view");
    view.addEventListener("click", onClick);
    return view;
  }

  function renderPeek(page) {
    renderPager("peek", page);
    var empty = pages.peek.cursor === null ? "none" : "none on this page (delivered since?): go to the first page";
    fill("peek", page.rows, 9, function (m) {
      var tr = el("tr");
      tr.setAttribute("data-id", m.id);
      cell(tr, m.id, "num", "id");
      cell(tr, m.queue, "text", "queue");
      cell(tr, m.state, null, "state");
      cell(tr, age(m.age_s), "num", "age");
      cell(tr, m.deliveries_count, "num", "deliveries");
      cell(tr, m.acquired_by || "", "text", "acquired_by");
      cell(tr, preview(m.payload_preview, m.payload_truncated, m.payload_bytes), "text", "payload");
      cell(tr, m.last_error_truncated ? m.last_error + "…" : m.last_error || "", "text", "last_error");
      var actions = cell(tr, null, null, "actions");
      actions.append(viewButton(function () {
        showDetail("/api/messages/", "Message", m.id, rowAnchor("peek", "data-id", m.id));
      }));
      return tr;
    }, empty);
  }

  function renderDead(page) {
    renderPager("dead", page);
    var empty = pages.dead.cursor === null ? "none" : "none on this page: go to the first page";
    fill("dead", page.rows, 7, function (d) {
      var tr = el("tr");
      tr.setAttribute("data-id", d.id);
      cell(tr, d.id, "num", "id");
      cell(tr, d.queue, "text", "queue");
      cell(tr, d.reason, "text", "reason");
      cell(tr, age(d.dead_age_s) + " ago", "num", "died");
      cell(tr, preview(d.payload_preview, d.payload_truncated, d.payload_bytes), "text", "payload");
      cell(tr, d.error_truncated ? d.error + "…" : d.error || "", "text", "error");
      var actions = cell(tr, null, null, "actions");
      var anchor = rowAnchor("dead", "data-id", d.id);
      var replay = el("button", "Replay…", "write");
      replay.type = "button";
      replay.setAttribute("data-action", "replay");
      replay.disabled = !writable;
      replay.addEventListener("click", function () { askReplay({ ids: [String(d.id)] }, anchor); });
      actions.append(viewButton(function () { showDetail("/api/dead-letters/", "Dead letter", d.id, anchor); }), " ", replay);
      return tr;
    }, empty);
  }

  // The whole record, asked for when wanted: the lists only carry previews.
  function showDetail(path, title, id, anchor) {
    call("GET", path + encodeURIComponent(id)).then(function (row) {
      put($("detail-title"), title + " #" + row.id);
      put($("detail-body"), JSON.stringify(row, null, 2));
      show("detail", anchor);
    }, function (e) { notice(e.message, true, anchor); });
  }

  function listQuery(list, fields) {
    var params = new URLSearchParams();
    Object.keys(fields).forEach(function (name) {
      var value = $(fields[name]).value.trim();
      if (value) params.set(name, value);
    });
    params.set("limit", String(PAGE_ROWS));
    if (pages[list].cursor !== null) params.set(pages[list].param, pages[list].cursor);
    return params;
  }

  function refresh() {
    return Promise.all([
      call("GET", "/api/status").then(function (s) {
        writable = s.writable;
        put($("schema"), "schema " + s.schema);
        renderQueues(s.queues);
        renderWorkers(s.workers);
        renderSubscriptions(s.subscriptions);
        renderUnrouted(s.unrouted);
        renderChart(s.history);
        Array.prototype.forEach.call(document.querySelectorAll("button.write"), function (b) {
          b.disabled = !writable;
        });
        put($("status-line"),
          "updated " + new Date(s.now).toLocaleTimeString() + (writable ? "" : " · read-only (no write token configured)"));
        $("status-line").className = "muted";
      }),
      loadPage("peek", "/api/peek", { queue: "peek-queue", state: "peek-state" }, renderPeek),
      loadPage("dead", "/api/dead-letters", { queue: "dead-queue", reason: "dead-reason" }, renderDead),
    ]).catch(function (e) {
      // The rows shown stay: a database outage (503) names the database, and the next poll tries again.
      put($("status-line"), e.status === 401 || e.status === 403
        ? e.message + ": enter a token above"
        : (e.status === 503 ? "" : "refresh failed: ") + e.message);
      $("status-line").className = "muted alarm";
    });
  }

  function plural(n) { return n + " dead letter" + (n === 1 ? "" : "s"); }

  function confirmBox(text, queues, anchor, onYes) {
    put($("confirm-text"), text);
    $("confirm-queues").replaceChildren.apply($("confirm-queues"), queues.map(function (q) {
      return el("li", q.label + ": " + q.n);
    }));
    pending = { action: onYes, anchor: anchor };
    $("confirm-yes").disabled = false;
    show("confirm", anchor);
    $("confirm-yes").focus({ preventScroll: true });
  }

  function closeConfirm() {
    pending = null;
    hide("confirm");
  }

  // Why replay leaves a dead letter: its id is back in messages, or (kept for want of a subscriber) its
  // topic still has none.
  function skipReason(filter) {
    if (filter.reason === NO_SUBSCRIBERS) return "their topic has no subscriber yet";
    if (filter.reason) return "a message with the same id exists";
    return "a message with the same id exists, or their topic has no subscriber yet";
  }

  function askReplay(filter, anchor) {
    hide("notice");
    var why = skipReason(filter);
    var kind = filter.reason === NO_SUBSCRIBERS ? "topic " : "queue ";
    call("POST", "/api/dead-letters/replay", Object.assign({ dryRun: true }, filter)).then(function (r) {
      if (r.replayed === 0) {
        notice("Nothing to replay" + (r.skipped ? " (" + r.skipped + " skipped: " + why + ")" : "") + ".", false, anchor);
        return;
      }
      var text = "This will replay " + plural(r.replayed) + " into messages, ready now" +
        (r.skipped ? "; " + r.skipped + " will be skipped (" + why + ")" : "") + ".";
      confirmBox(text, r.queues.filter(function (q) { return q.replayed > 0; }).map(function (q) {
        return { label: kind + q.queue, n: q.replayed };
      }), anchor, function () {
        return call("POST", "/api/dead-letters/replay", filter).then(function (done) {
          notice("Replayed " + plural(done.replayed) + (done.skipped ? ", skipped " + done.skipped : "") + ".", false, anchor);
        });
      });
    }, function (e) { notice(e.message, true, anchor); });
  }

  function askPurge() {
    var anchor = afterAnchor("purge-form");
    hide("notice");
    var body = { olderThan: $("purge-older").value.trim() };
    var queue = $("purge-queue").value.trim();
    if (queue) body.queue = queue;
    call("POST", "/api/dead-letters/purge", Object.assign({ dryRun: true }, body)).then(function (r) {
      if (r.purged === 0) {
        notice("No dead letter is older than " + body.olderThan + (queue ? " in queue " + queue : "") + ".", false, anchor);
        return;
      }
      confirmBox("This will delete " + plural(r.purged) + " older than " + body.olderThan + ", for good.",
        r.queues.map(function (q) { return { label: "queue " + q.queue, n: q.purged }; }), anchor,
        function () {
          return call("POST", "/api/dead-letters/purge", body).then(function (done) {
            notice("Purged " + plural(done.purged) + ".", false, anchor);
          });
        });
    }, function (e) { notice(e.message, true, anchor); });
  }

  function pagerControls(list) {
    var state = pages[list];
    $(list + "-next").addEventListener("click", function () {
      if (state.next === null) return;
      state.back.push(state.cursor);
      state.cursor = state.next;
      refresh();
    });
    $(list + "-prev").addEventListener("click", function () {
      if (state.cursor === null) return;
      state.cursor = state.back.pop();
      if (state.cursor === undefined) state.cursor = null;
      refresh();
    });
    $(list + "-first").addEventListener("click", function () { firstPage(list); refresh(); });
  }

  function start() {
    ["notice", "confirm", "detail"].forEach(function (name) { boxes[name] = $(name); });
    $("boxes").hidden = true;
    $("token").value = token();
    $("token-form").addEventListener("submit", function (ev) {
      ev.preventDefault();
      try { sessionStorage.setItem(TOKEN_KEY, $("token").value.trim()); } catch (e) { /* private mode */ }
      refresh();
    });
    $("token-clear").addEventListener("click", function () {
      try { sessionStorage.removeItem(TOKEN_KEY); } catch (e) { /* private mode */ }
      $("token").value = "";
      refresh();
    });
    // A new filter starts from the first page: the old cursor belongs to another list.
    $("peek-form").addEventListener("submit", function (ev) { ev.preventDefault(); firstPage("peek"); refresh(); });
    $("dead-form").addEventListener("submit", function (ev) { ev.preventDefault(); firstPage("dead"); refresh(); });
    pagerControls("peek");
    pagerControls("dead");
    $("replay-matching").addEventListener("click", function () {
      var queue = $("dead-queue").value.trim();
      var reason = $("dead-reason").value.trim();
      var filter = {};
      if (queue) filter.queue = queue;
      if (reason) filter.reason = reason;
      // No filter: every dead letter, which the API only takes when asked for by name.
      askReplay(queue || reason ? filter : { all: true }, afterAnchor("dead-form"));
    });
    $("purge-form").addEventListener("submit", function (ev) { ev.preventDefault(); askPurge(); });
    $("confirm-no").addEventListener("click", closeConfirm);
    $("confirm-yes").addEventListener("click", function () {
      var asked = pending;
      if (!asked) return;
      $("confirm-yes").disabled = true;
      asked.action().then(function () { closeConfirm(); return refresh(); }, function (e) {
        closeConfirm();
        notice(e.message, true, asked.anchor);
      });
    });
    $("detail-close").addEventListener("click", function () { hide("detail"); });
    refresh();
    timer = setInterval(function () { if (!document.hidden) refresh(); }, POLL_MS);
  }

  start();
})();
`;
