// Cluster page: every /ws/cluster/ frame is a full snapshot (nodes, running runs, the queue); redraw it whole.
import { el, formatBytes, statusBadge, toLogin } from "./api.js";
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
    runCell(r), el("td", {}, r.team), el("td", {}, statusBadge(r.status)), el("td", {}, r.priority),
    el("td", {}, resourcesText(r.resources)))), "Nothing running.");
  fill($("cluster-queue"), (snap.queue || []).map((r) => el("tr", { dataset: { position: String(r.position) } },
    el("td", {}, String(r.position)), runCell(r), el("td", {}, r.team), el("td", {}, r.priority),
    el("td", {}, resourcesText(r.resources)))), "The queue is empty.");
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
