/**
 * The relay panel's script, its own file beside console.js: plain ES2017, no build step. It sits in a
 * template literal, so it holds no backtick, no dollar-brace and no backslash escape.
 */
export const RELAYS_SCRIPT = `
(function () {
  "use strict";
  var base = document.body.getAttribute("data-base") || "";
  var POLL_MS = 3000;
  var cp = String.fromCharCode;
  // Bidi controls (LRM, RLM, ALM, embeddings, overrides, isolates) could reorder a cell's text: shown as
  // their code point instead.
  var BIDI = new RegExp("[" + cp(0x061c, 0x200e, 0x200f) + cp(0x202a) + "-" + cp(0x202e) + cp(0x2066) + "-" + cp(0x2069) + "]", "g");

  function visible(text) {
    return String(text).replace(BIDI, function (c) {
      return "[U+" + c.charCodeAt(0).toString(16).toUpperCase() + "]";
    });
  }

  function cell(tr, text, cls, col) {
    var td = document.createElement("td");
    td.textContent = visible(text);
    if (cls) td.className = cls;
    td.setAttribute("data-col", col);
    tr.appendChild(td);
  }

  function token() {
    try { return sessionStorage.getItem("outbox-console-token") || ""; } catch (e) { return ""; }
  }

  function render(report) {
    var body = document.getElementById("relays").tBodies[0];
    var queues = Object.keys(report.relays || {}).sort();
    var rows = queues.map(function (queue) {
      var r = report.relays[queue];
      var tr = document.createElement("tr");
      tr.setAttribute("data-queue", queue);
      cell(tr, queue, "text", "queue");
      cell(tr, r.type, null, "type");
      cell(tr, r.state, r.state === "ok" ? null : "alarm", "state");
      cell(tr, r.target || "", "text", "target");
      cell(tr, r.error || "", "text", "error");
      return tr;
    });
    if (rows.length === 0) {
      var tr = document.createElement("tr");
      var td = document.createElement("td");
      td.textContent = "none: this service has no built-in relay";
      td.className = "empty";
      td.colSpan = 5;
      tr.appendChild(td);
      rows = [tr];
    }
    body.replaceChildren.apply(body, rows);
    document.getElementById("relays-note").textContent = "";
  }

  function refresh() {
    var headers = { accept: "application/json" };
    var t = token();
    if (t) headers.authorization = "Bearer " + t;
    fetch(base + "/api/relays", { headers: headers, cache: "no-store", credentials: "omit" })
      .then(function (res) {
        return res.json().catch(function () { return {}; }).then(function (data) {
          if (!res.ok) throw new Error((data && data.error) || "HTTP " + res.status);
          render(data);
        });
      })
      .catch(function (e) {
        document.getElementById("relays-note").textContent = "relays not shown: " + visible(e.message);
      });
  }

  refresh();
  setInterval(function () { if (!document.hidden) refresh(); }, POLL_MS);
})();
`;
