// Cluster page: every /ws/cluster/ frame is a full snapshot (nodes, what admitted runs hold, the queue, team usage);
// redraw it whole.
/* global Plotly */
import { el, formatBytes, statusBadge, toLogin } from "./api.js";
import { PLOT_CONFIG, plotLayout } from "./charts.js";
import { ClusterSocket } from "./live.js";

const $ = (id) => document.getElementById(id);
const connection = $("connection");

function resourcesText(res) {
  if (!res || !Object.keys(res).length) return "default";
  const flat = (obj) => Object.entries(obj).map(([k, v]) => `${k}=${v}`).join(" ");
  // A gang of bundles: one bracket per worker's bundle.
  if (Array.isArray(res.bundles)) return res.bundles.map((b) => `[${flat(b)}]`).join(" ");
  return flat(res);
}

function runCell(row) {
  // Other teams' runs come without id or name: only the team and what they hold are shared.
  return row.mine && row.id !== null
    ? el("td", {}, el("a", { href: `/runs/${row.id}/` }, `#${row.id} ${row.name}`))
    : el("td", { className: "muted" }, "(another team's run)");
}

function fill(table, rows, empty) {
  const body = table.tBodies[0];
  body.replaceChildren(...rows);
  if (!rows.length) body.append(el("tr", {}, el("td", { colSpan: 7, className: "muted" }, empty)));
  table.dataset.count = String(rows.length);
}

function render(snap) {
  const error = $("cluster-error");
  error.hidden = !snap.error;
  error.textContent = snap.error || "";
  const nodes = snap.nodes || [];
  fill($("cluster-nodes"), nodes.map((n) => el("tr", { dataset: { node: n.node_id || "" } },
    el("td", { title: n.node_id || "" }, `${(n.node_id || "?").slice(0, 8)}${n.head ? " (head)" : ""}`),
    el("td", {}, n.ip || ""), el("td", {}, n.state || ""), el("td", {}, String(n.cpus)), el("td", {}, String(n.gpus)),
    el("td", {}, formatBytes(n.memory_bytes)), el("td", {}, resourcesText(n.custom)))), "No node details.");
  const total = (k) => nodes.reduce((sum, n) => sum + (Number(n[k]) || 0), 0);
  $("cluster-totals").textContent = nodes.length
    ? `${nodes.length} node(s) · ${total("cpus")} CPUs · ${total("gpus")} GPUs · ${formatBytes(total("memory_bytes"))}`
    : "";
  fill($("cluster-running"), (snap.running || []).map((r) => el("tr", {},
    runCell(r), el("td", {}, r.team),
    el("td", {}, statusBadge(r.status), r.stopping_for_preemption ? " stopping (preempted)" : ""),
    el("td", {}, r.priority + (r.preemptible ? " (preemptible)" : "") + (r.backfilled ? " · backfilled" : "")),
    el("td", {}, `${r.gpus} GPU · ${r.cpus} CPU`), el("td", { title: (r.nodes || []).join(", ") },
      (r.nodes || []).map((n) => n.slice(0, 8)).join(", ")), el("td", {}, timeText(r.since)))), "Nothing running.");
  fill($("cluster-queue"), (snap.queue || []).map((r) => el("tr", { dataset: { position: String(r.position) } },
    el("td", {}, String(r.position)), runCell(r), el("td", {}, r.team), el("td", {}, r.priority),
    el("td", {}, resourcesText(r.resources)), el("td", { title: r.message || "" }, r.reason || "not yet seen"),
    el("td", {}, r.estimated_start ? timeText(r.estimated_start) : "—"))), "The queue is empty.");
  drawUsage(snap.usage);
}

function timeText(iso) {
  if (!iso) return "";
  const at = new Date(iso);
  return at.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
}

function drawUsage(usage) {
  const div = $("usage-chart");
  if (!usage || typeof Plotly === "undefined") return;
  const teams = Object.entries(usage.teams || {});
  // GPUs when any team held one over the window; a CPU-only cluster charts CPUs.
  const key = teams.some(([, s]) => s.gpus.some((v) => v > 0)) ? "gpus" : "cpus";
  const traces = teams.map(([team, series]) => ({
    x: usage.times, y: series[key], name: team, type: "scatter", mode: "lines", stackgroup: "teams",
  }));
  $("usage-window").textContent = `mean ${key === "gpus" ? "GPUs" : "CPUs"} held, last ${Math.round(usage.window_s / 3600)} h`;
  div.dataset.teams = String(teams.length);
  Plotly.react(div, traces, { ...plotLayout({ xTitle: "", yTitle: key === "gpus" ? "GPUs" : "CPUs" }) }, PLOT_CONFIG);
  const share = usage.fair_share_hours;
  $("fair-share").textContent = share && Object.keys(share).length
    ? "Fair-share usage over the window (cluster-share hours; less goes first among equal priorities): "
      + Object.entries(share).map(([team, hours]) => `${team} ${hours.toFixed(2)}`).join(" · ")
    : "";
}

const socket = new ClusterSocket({
  onSnapshot: render,
  onState: (state, detail, code) => {
    connection.dataset.state = state;
    connection.textContent = detail ? `${state}: ${detail}` : state;
    if (code === 4401) toLogin();
  },
}).start();
$("refresh-cluster").addEventListener("click", () => socket.refresh());
