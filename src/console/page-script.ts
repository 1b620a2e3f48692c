/**
 * The page script: plain ES2017, no build step; served as a file (the CSP allows no inline script). It
 * sits in a template literal, so it holds no backtick, no dollar-brace and no backslash escape.
 */
export const CONSOLE_SCRIPT = `
(function () {
  "use strict";
  // Every value from the API is rendered with textContent or setAttribute, never as markup: payloads,
  // errors and queue names are untrusted text.
  var base = document.body.getAttribute("data-base") || "";
  var TOKEN_KEY = "outbox-console-token";
  var POLL_MS = 3000;
  var SVG = "http://www.w3.org/2000/svg";
  var writable = false;
  var pending = null;
  var timer = null;

  function $(id) { return document.getElementById(id); }

  function el(tag, text, cls) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
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

  function notice(text, isError) {
    var box = $("notice");
    box.textContent = text;
    box.className = isError ? "notice error" : "notice";
    box.hidden = false;
  }

  function age(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    var s = Math.floor(Number(seconds));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
    return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
  }

  function short(value, max) {
    var text = typeof value === "string" ? value : JSON.stringify(value);
    if (text === undefined || text === null) return "";
    return text.length > max ? text.slice(0, max - 1) + "…" : text;
  }

  function cell(row, value, cls, col) {
    var td = el("td", value, cls);
    if (col) td.setAttribute("data-col", col);
    row.appendChild(td);
    return td;
  }

  function fill(tableId, rows, columns, renderRow) {
    var body = $(tableId).tBodies[0];
    var out = rows.map(renderRow);
    if (out.length === 0) {
      var tr = el("tr");
      var td = el("td", "none", "empty");
      td.colSpan = columns;
      tr.appendChild(td);
      out = [tr];
    }
    body.replaceChildren.apply(body, out);
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
      replay.addEventListener("click", function () { askReplay({ queue: t.topic, reason: NO_SUBSCRIBERS }); });
      actions.append(list, " ", replay);
      return tr;
    });
    var note = $("unrouted-note");
    var more = kept.topics - kept.byTopic.length;
    note.textContent = kept.events === 0 ? "" :
      kept.events + " event" + (kept.events === 1 ? "" : "s") + " kept" +
      (more > 0 ? " (the " + kept.byTopic.length + " topics with most shown, " + more + " more)" : "") +
      ". Subscribe a queue to the topic, then replay: each goes to the topic's subscribers of that moment.";
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
      $("chart-scale").textContent = "collecting samples… ";
    } else {
      var maxReady = Math.max.apply(null, samples.map(function (s) { return s.ready; }));
      var maxRate = Math.max.apply(null, samples.map(function (s) { return Math.max(s.deliveredPerSec, s.deadPerSec); }));
      root.appendChild(line(samples, "ready", maxReady, w, h, "ready"));
      root.appendChild(line(samples, "deliveredPerSec", maxRate, w, h, "delivered"));
      root.appendChild(line(samples, "deadPerSec", maxRate, w, h, "dead"));
      // Outside the SVG: its aspect ratio is not kept, which would stretch text.
      $("chart-scale").textContent = "scale: ready up to " + maxReady + ", rates up to " + maxRate.toFixed(1) + "/s ·";
    }
    $("chart").replaceChildren(root);
  }

  function renderPeek(rows) {
    fill("peek", rows, 8, function (m) {
      var tr = el("tr");
      tr.setAttribute("data-id", m.id);
      cell(tr, m.id, "num", "id");
      cell(tr, m.queue, "text", "queue");
      cell(tr, m.state, null, "state");
      cell(tr, age(m.age_s), "num", "age");
      cell(tr, m.deliveries_count, "num", "deliveries");
      cell(tr, m.acquired_by || "", "text", "acquired_by");
      cell(tr, short(m.payload, 160), "text", "payload");
      cell(tr, short(m.last_error || "", 160), "text", "last_error");
      return tr;
    });
  }

  function renderDead(rows) {
    fill("dead", rows, 7, function (d) {
      var tr = el("tr");
      tr.setAttribute("data-id", d.id);
      cell(tr, d.id, "num", "id");
      cell(tr, d.queue, "text", "queue");
      cell(tr, d.reason, "text", "reason");
      cell(tr, age(d.dead_age_s) + " ago", "num", "died");
      cell(tr, short(d.payload, 160), "text", "payload");
      cell(tr, short(d.error || "", 160), "text", "error");
      var actions = cell(tr, null, null, "actions");
      var view = el("button", "View");
      view.type = "button";
      view.setAttribute("data-action", "view");
      view.addEventListener("click", function () { showDead(d.id); });
      var replay = el("button", "Replay…", "write");
      replay.type = "button";
      replay.setAttribute("data-action", "replay");
      replay.disabled = !writable;
      replay.addEventListener("click", function () { askReplay({ ids: [String(d.id)] }); });
      actions.append(view, " ", replay);
      return tr;
    });
  }

  function showDead(id) {
    call("GET", "/api/dead-letters/" + encodeURIComponent(id)).then(function (row) {
      $("dead-detail-id").textContent = "#" + row.id;
      $("dead-detail-body").textContent = JSON.stringify(row, null, 2);
      $("dead-detail").hidden = false;
    }, function (e) { notice(e.message, true); });
  }

  function deadQuery() {
    var params = new URLSearchParams();
    var queue = $("dead-queue").value.trim();
    var reason = $("dead-reason").value.trim();
    if (queue) params.set("queue", queue);
    if (reason) params.set("reason", reason);
    params.set("limit", "50");
    return params;
  }

  function peekQuery() {
    var params = new URLSearchParams();
    var queue = $("peek-queue").value.trim();
    var state = $("peek-state").value;
    if (queue) params.set("queue", queue);
    if (state) params.set("state", state);
    params.set("limit", "20");
    return params;
  }

  function refresh() {
    return Promise.all([
      call("GET", "/api/status").then(function (s) {
        writable = s.writable;
        $("schema").textContent = "schema " + s.schema;
        renderQueues(s.queues);
        renderWorkers(s.workers);
        renderSubscriptions(s.subscriptions);
        renderUnrouted(s.unrouted);
        renderChart(s.history);
        Array.prototype.forEach.call(document.querySelectorAll("button.write"), function (b) {
          b.disabled = !writable;
        });
        $("status-line").textContent =
          "updated " + new Date(s.now).toLocaleTimeString() + (writable ? "" : " · read-only (no write token configured)");
      }),
      call("GET", "/api/peek?" + peekQuery().toString()).then(renderPeek),
      call("GET", "/api/dead-letters?" + deadQuery().toString()).then(renderDead),
    ]).catch(function (e) {
      $("status-line").textContent = e.status === 401 || e.status === 403
        ? e.message + ": enter a token above"
        : "refresh failed: " + e.message;
    });
  }

  function plural(n) { return n + " dead letter" + (n === 1 ? "" : "s"); }

  function confirmBox(text, queues, onYes) {
    $("confirm-text").textContent = text;
    $("confirm-queues").replaceChildren.apply($("confirm-queues"), queues.map(function (q) {
      return el("li", q.label + ": " + q.n);
    }));
    pending = onYes;
    $("confirm-yes").disabled = false;
    $("confirm").hidden = false;
  }

  function closeConfirm() {
    pending = null;
    $("confirm").hidden = true;
  }

  // Why replay leaves a dead letter: its id is back in messages, or (kept for want of a subscriber) its
  // topic still has none.
  function skipReason(filter) {
    if (filter.reason === NO_SUBSCRIBERS) return "their topic has no subscriber yet";
    if (filter.reason) return "a message with the same id exists";
    return "a message with the same id exists, or their topic has no subscriber yet";
  }

  function askReplay(filter) {
    $("notice").hidden = true;
    var why = skipReason(filter);
    var kind = filter.reason === NO_SUBSCRIBERS ? "topic " : "queue ";
    call("POST", "/api/dead-letters/replay", Object.assign({ dryRun: true }, filter)).then(function (r) {
      if (r.replayed === 0) {
        notice("Nothing to replay" + (r.skipped ? " (" + r.skipped + " skipped: " + why + ")" : "") + ".", false);
        return;
      }
      var text = "This will replay " + plural(r.replayed) + " into messages, ready now" +
        (r.skipped ? "; " + r.skipped + " will be skipped (" + why + ")" : "") + ".";
      confirmBox(text, r.queues.filter(function (q) { return q.replayed > 0; }).map(function (q) {
        return { label: kind + q.queue, n: q.replayed };
      }), function () {
        return call("POST", "/api/dead-letters/replay", filter).then(function (done) {
          notice("Replayed " + plural(done.replayed) + (done.skipped ? ", skipped " + done.skipped : "") + ".", false);
        });
      });
    }, function (e) { notice(e.message, true); });
  }

  function askPurge() {
    $("notice").hidden = true;
    var body = { olderThan: $("purge-older").value.trim() };
    var queue = $("purge-queue").value.trim();
    if (queue) body.queue = queue;
    call("POST", "/api/dead-letters/purge", Object.assign({ dryRun: true }, body)).then(function (r) {
      if (r.purged === 0) {
        notice("No dead letter is older than " + body.olderThan + (queue ? " in queue " + queue : "") + ".", false);
        return;
      }
      confirmBox("This will delete " + plural(r.purged) + " older than " + body.olderThan + ", for good.",
        r.queues.map(function (q) { return { label: "queue " + q.queue, n: q.purged }; }),
        function () {
          return call("POST", "/api/dead-letters/purge", body).then(function (done) {
            notice("Purged " + plural(done.purged) + ".", false);
          });
        });
    }, function (e) { notice(e.message, true); });
  }

  function start() {
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
    $("peek-form").addEventListener("submit", function (ev) { ev.preventDefault(); refresh(); });
    $("dead-form").addEventListener("submit", function (ev) { ev.preventDefault(); refresh(); });
    $("replay-matching").addEventListener("click", function () {
      var queue = $("dead-queue").value.trim();
      var reason = $("dead-reason").value.trim();
      var filter = {};
      if (queue) filter.queue = queue;
      if (reason) filter.reason = reason;
      // No filter: every dead letter, which the API only takes when asked for by name.
      askReplay(queue || reason ? filter : { all: true });
    });
    $("purge-form").addEventListener("submit", function (ev) { ev.preventDefault(); askPurge(); });
    $("confirm-no").addEventListener("click", closeConfirm);
    $("confirm-yes").addEventListener("click", function () {
      var action = pending;
      if (!action) return;
      $("confirm-yes").disabled = true;
      action().then(function () { closeConfirm(); return refresh(); }, function (e) {
        closeConfirm();
        notice(e.message, true);
      });
    });
    $("dead-detail-close").addEventListener("click", function () { $("dead-detail").hidden = true; });
    refresh();
    timer = setInterval(function () { if (!document.hidden) refresh(); }, POLL_MS);
  }

  start();
})();
`;
