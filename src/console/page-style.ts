/** The console's stylesheet, served as a file: the CSP allows no inline style. */
export const CONSOLE_STYLE = `
:root { color-scheme: light; --fg: #1d2330; --muted: #6b7280; --line: #e3e6ec; --bg: #f7f8fa; --accent: #2563eb; --bad: #b42318; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; flex-wrap: wrap; align-items: center; gap: 12px 24px; padding: 12px 24px; background: #fff; border-bottom: 1px solid var(--line); }
h1 { font-size: 18px; margin: 0; }
h2 { font-size: 15px; margin: 0 0 8px; }
h3 { font-size: 14px; margin: 0 0 6px; }
main { padding: 8px 24px 32px; display: grid; gap: 16px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 12px 16px; }
.muted { color: var(--muted); font-weight: normal; }
.token { margin-left: auto; display: flex; gap: 6px; align-items: center; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-weight: 600; color: var(--muted); font-size: 12px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.text { max-width: 360px; overflow-wrap: anywhere; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; }
td.empty { color: var(--muted); text-align: center; }
td.alarm { color: var(--bad); font-weight: 600; }
td[data-col="actions"], td[data-col="died"] { white-space: nowrap; }
table + h3 { margin-top: 14px; }
.filters { display: flex; flex-wrap: wrap; gap: 6px; align-items: center; margin-bottom: 8px; }
input, select, button { font: inherit; padding: 3px 8px; border: 1px solid #c9ced8; border-radius: 5px; background: #fff; }
button { cursor: pointer; }
button:disabled { cursor: not-allowed; opacity: .5; }
button.danger { border-color: var(--bad); color: var(--bad); }
.notice { margin: 6px 0; padding: 8px 12px; border-radius: 6px; background: #ecfdf3; border: 1px solid #abefc6; }
.notice.error { background: #fef3f2; border-color: #fecdca; color: var(--bad); }
.confirm { margin: 6px 0; padding: 12px 16px; border-radius: 8px; background: #fffaeb; border: 1px solid #fedf89; }
td.box { padding: 0 8px 4px; border-bottom: 1px solid var(--line); }
.alarm { color: var(--bad); }
.pager { display: flex; gap: 6px; align-items: center; margin-top: 8px; }
/* A bidi control made visible; each cell also isolates its text from its neighbours' direction. */
.ctl { padding: 0 2px; border: 1px solid var(--line); border-radius: 3px; color: var(--bad); font-size: 11px; }
td { unicode-bidi: isolate; }
.confirm p { margin: 0 0 6px; font-weight: 600; }
.chart svg { width: 100%; height: 160px; display: block; }
.chart .axis { stroke: var(--line); }
.chart .ready { stroke: var(--accent); fill: none; stroke-width: 2; }
.chart .delivered { stroke: #12b76a; fill: none; stroke-width: 2; }
.chart .dead { stroke: var(--bad); fill: none; stroke-width: 1.5; stroke-dasharray: 4 3; }
.legend { margin: 4px 0 0; color: var(--muted); font-size: 12px; }
.key { display: inline-block; width: 14px; height: 3px; margin: 0 4px 3px 12px; vertical-align: middle; }
.key.ready { background: var(--accent); } .key.delivered { background: #12b76a; } .key.dead { background: var(--bad); }
.detail pre { background: var(--bg); border: 1px solid var(--line); border-radius: 6px; padding: 8px; overflow: auto; max-height: 360px; white-space: pre-wrap; overflow-wrap: anywhere; }
`;
