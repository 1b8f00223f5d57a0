// The dashboard page; see dashboard.h. Element ids are stable (tests and users' scripts read them): #run, #phase,
// #summary, #learners (tbody rows tr.learner with data-id and data-state), #curve (an SVG with polyline #curve-line),
// and body[data-updates] counts the status polls drawn.
#include "monitor/dashboard.h"

namespace dloco {

const std::string& dashboard_page() {
  static const std::string page = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>dloco</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 .3em; } .muted { color: #777; }
table { border-collapse: collapse; margin: .8em 0; } th, td { padding: .25em .8em; text-align: right; }
th { border-bottom: 1px solid #999; } td:first-child, th:first-child { text-align: left; }
tr.absent td { background: #fde2e1; } tr.finished td { color: #777; }
#summary span { margin-right: 1.5em; } svg { border: 1px solid #ccc; background: #fafafa; }
</style></head>
<body data-updates="0">
<h1>dloco run <span id="run">…</span> <span id="phase" class="muted"></span></h1>
<div id="summary">waiting for the syncer's first status…</div>
<table><thead><tr><th>learner</th><th>state</th><th>step</th><th>loss</th><th>tokens/s</th><th>heartbeat age</th>
<th>MB up / down</th></tr></thead><tbody id="learners"></tbody></table>
<div class="muted">validation loss of the global model (nats/token) vs global step</div>
<svg id="curve" width="640" height="240" viewBox="0 0 640 240"><polyline id="curve-line" fill="none"
stroke="#1f77b4" stroke-width="2" points=""/><g id="curve-axes"></g></svg>
<script>
"use strict";
const fmt = (x, d) => (x === null || x === undefined || Number.isNaN(x)) ? "–" : Number(x).toFixed(d);
function cell(tr, text) { const td = document.createElement("td"); td.textContent = text; tr.appendChild(td); }
function draw(s) {
  document.getElementById("run").textContent = s.run;
  document.getElementById("phase").textContent = "(" + s.phase + ")";
  const pct = s.tokens_budget > 0 ? 100 * s.tokens_trained / s.tokens_budget : 0;
  document.getElementById("summary").innerHTML = "";
  for (const [k, v] of [["global step", s.global_step], ["trained", fmt(pct, 1) + "%"], ["merges", s.merges],
                        ["last quorum", s.quorum], ["live", s.live + "/" + s.learners.length],
                        ["goodput", fmt(100 * s.goodput, 1) + "%"], ["val loss", fmt(s.val_loss, 4)],
                        ["answers dropped / refused", s.answers_dropped + " / " + s.answers_refused],
                        ["syncer MB sent / received",
                         fmt(s.bytes_sent / 1e6, 1) + " / " + fmt(s.bytes_received / 1e6, 1)]]) {
    const span = document.createElement("span"); span.textContent = k + ": " + v;
    document.getElementById("summary").appendChild(span);
  }
  const body = document.getElementById("learners");
  body.innerHTML = "";
  for (const l of s.learners) {
    const tr = document.createElement("tr");
    tr.className = "learner " + l.state; tr.dataset.id = l.id; tr.dataset.state = l.state;
    for (const t of [l.id, l.state, l.step, fmt(l.loss, 4), fmt(l.tokens_per_s, 0), fmt(l.heartbeat_age_s, 1) + " s",
                     fmt(l.bytes_sent / 1e6, 2) + " / " + fmt(l.bytes_received / 1e6, 2)]) cell(tr, t);
    body.appendChild(tr);
  }
  const pts = s.evals.filter(e => Number.isFinite(e.val_loss));
  const line = document.getElementById("curve-line"), axes = document.getElementById("curve-axes");
  axes.innerHTML = "";
  if (pts.length > 0) {
    const x1 = Math.max(1, ...pts.map(e => e.global_step)), ys = pts.map(e => e.val_loss);
    const y0 = Math.min(...ys), y1 = Math.max(...ys), span = Math.max(1e-9, y1 - y0);
    line.setAttribute("points", pts.map(e => (40 + 590 * e.global_step / x1).toFixed(1) + "," +
                                             (220 - 200 * (e.val_loss - y0) / span).toFixed(1)).join(" "));
    for (const [y, label] of [[20, fmt(y1, 3)], [220, fmt(y0, 3)]]) {
      const t = document.createElementNS("http://www.w3.org/2000/svg", "text");
      t.setAttribute("x", 2); t.setAttribute("y", y); t.setAttribute("font-size", 10); t.textContent = label;
      axes.appendChild(t);
    }
  }
  document.body.dataset.updates = Number(document.body.dataset.updates) + 1;
}
async function poll() {
  try {
    // Off loopback the endpoint asks for the run secret: the page takes it from its URL's #token=… (never sent).
    const token = new URLSearchParams(location.hash.slice(1)).get("token");
    const r = await fetch("status.json", {cache: "no-store",
                                          headers: token ? {"Authorization": "Bearer " + token} : {}});
    if (r.ok) draw(await r.json());
  } catch (e) {
    document.getElementById("phase").textContent = "(syncer unreachable)";
  }
  setTimeout(poll, 1000);
}
poll();
</script></body></html>
)HTML";
  return page;
}

}  // namespace dloco
