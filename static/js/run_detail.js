// Run page: one websocket feeds the charts, the board, the panels and the log. Events are queued and applied
// once per animation frame, so a backlog of thousands of events costs a few redraws.
import { el, formatBytes, getJSON, postJSON, renderErrors, toLogin } from "./api.js";
import { ConnectFourBoard } from "./board.js";
import { ChartSet } from "./charts.js";
import { EventLog, layoutText } from "./event_log.js";
import { RunEventSocket } from "./live.js";

const run = JSON.parse(document.getElementById("run-data").textContent);
const FINISHED = new Set(run.finished);
const CHECKPOINT_REFRESH_MS = 15000;
const $ = (id) => document.getElementById(id);

const statusBadge = $("run-status");
const cancelButton = $("cancel-button");
const cloneButton = $("clone-button");
const actionErrors = $("action-errors");
const charts = new ChartSet($("charts"));
const board = new ConnectFourBoard($("board"), {
  caption: $("board-caption"), agentText: $("agent-text"), result: $("board-result"),
});
const log = new EventLog($("event-log"), $("log-filter"));
let status = run.status;
let cancelRequested = run.cancel_requested;
const serverError = !$("run-errors").hidden; // the page already shows run.error; old error events would repeat it

function setStatus(next, message) {
  // The row keeps "cancelling" once a cancel is asked for, even if the worker still reports running.
  if (cancelRequested && (next === "starting" || next === "running")) next = "cancelling";
  const changed = next !== status;
  status = next;
  statusBadge.textContent = next;
  statusBadge.dataset.status = next;
  statusBadge.className = `badge status-${next}`;
  cancelButton.disabled = FINISHED.has(next) || next === "cancelling";
  if (message !== undefined) $("status-message").textContent = message;
  if (changed) refreshCheckpoints();
  if (next !== "queued") showQueue(null);
}

// ---- the queue: where a waiting run stands and why (the last admission pass's word) ------------------

const REASONS = {
  quota: "its team is at its quota", capacity: "waiting for room on the cluster",
  priority: "a higher-priority run waits ahead", reservation: "held back so the first run in line is not delayed",
  admitted: "admitted", invalid: "cannot be scheduled",
};

function whenText(iso) {
  const at = new Date(iso);
  const minutes = Math.round((at - Date.now()) / 60000);
  const clock = at.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  return minutes <= 0 ? `expected to start now (${clock})` : `expected to start in ~${minutes} min (${clock})`;
}

function showQueue(queue) {
  const box = $("queue-info");
  if (status !== "queued" || !queue || !queue.reason) {
    box.hidden = true;
    return;
  }
  const parts = [];
  if (queue.reason === "admitted") parts.push(queue.message || "admitted; waiting for a worker to start it");
  else {
    parts.push(`Queue position ${queue.position} · ${REASONS[queue.reason] || queue.reason}`);
    if (queue.message) parts.push(queue.message);
    parts.push(queue.estimated_start ? whenText(queue.estimated_start)
      : "no start estimate yet (the runs it waits for have no expected end)");
  }
  box.textContent = parts.join(" — ");
  box.dataset.reason = queue.reason;
  box.hidden = false;
}

// ---- applying events --------------------------------------------------------------------------------

const selectorRows = new Map(); // stage -> <tr>
function showDecision(d) {
  let tr = selectorRows.get(d.stage);
  if (!tr) {
    tr = el("tr", { dataset: { stage: d.stage } });
    selectorRows.set(d.stage, tr);
    $("selector-table").tBodies[0].append(tr);
  }
  tr.replaceChildren(el("td", {}, d.stage), el("td", {}, layoutText(d.new_layout)),
    el("td", {}, d.switched ? `yes (was ${layoutText(d.old_layout)})` : "no"), el("td", {}, d.reason || ""));
  if (d.switched || !d.old_layout) {
    // The history keeps every switch (and each stage's first choice) with its reason; kept layouts only
    // update the row above.
    $("selector-history").tBodies[0].append(el("tr", {},
      el("td", {}, d.iteration ?? "start"), el("td", {}, d.stage),
      el("td", {}, `${d.old_layout ? d.old_layout.key || layoutText(d.old_layout) : "—"} → ${d.new_layout.key || layoutText(d.new_layout)}`),
      el("td", {}, d.reason || "")));
    $("selector-history").hidden = false;
  }
}

function showMemory(workers) {
  $("memory-table").tBodies[0].replaceChildren(...workers.map((w) => el("tr", {},
    el("td", {}, w.worker), el("td", {}, w.stage || ""), el("td", {}, formatBytes(w.used)),
    el("td", {}, formatBytes(w.peak)), el("td", {}, w.budget ? formatBytes(w.budget) : "—"))));
}

function showError(d) {
  const box = $("run-errors");
  box.append(el("p", {}, `${d.kind ? `${d.kind}: ` : ""}${d.message}`));
  box.hidden = false;
}

function apply(batch) {
  let move = null;
  let end = null;
  let memory = null;
  for (const e of batch) {
    const d = e.data;
    switch (e.type) {
      case "metrics": charts.addMetrics(d.iteration, d.values); break;
      case "memory": charts.addMemory(d.iteration, d.workers); memory = d.workers; break;
      case "run.status":
        // Statuses older than the page are already in the server-rendered badge (which may say "cancelling").
        if (e.seq > run.last_seq) setStatus(d.status, d.message);
        else $("status-message").textContent = d.message;
        break;
      case "game.move": move = d; break;
      case "game.end": end = d; break;
      case "selector.decision": showDecision(d); break;
      case "dispatch": $("dispatch").textContent = `Dispatch, iteration ${d.iteration}: moved ` +
        `${formatBytes(d.bytes_moved)}, via driver ${formatBytes(d.bytes_via_driver)}, ${Number(d.seconds).toFixed(3)} s`; break;
      case "error": if (e.seq > run.last_seq || !serverError) showError(d); break;
      default: break;
    }
  }
  const drawn = charts.flush();
  if (move) board.showMove(move); // only the newest position of the batch is worth drawing
  if (end) board.showEnd(end);
  if (memory) showMemory(memory);
  const iteration = batch.filter((e) => e.type === "metrics").pop();
  if (iteration && !iteration.data.values["sft/loss"]) $("iterations").textContent = String(iteration.data.iteration + 1);
  log.add(batch);
  return drawn;
}

// ---- batching: one apply per frame at most, and slower while redraws are expensive -----------------

const MAX_PAUSE_MS = 2000;
const queue = [];
let scheduled = false;
let fallback = null;
let drawMs = 0; // what the last apply cost, Plotly's redraws included

async function flush() {
  if (!scheduled) return;
  scheduled = false;
  clearTimeout(fallback);
  const started = performance.now();
  await apply(queue.splice(0));
  drawMs = performance.now() - started;
}

function enqueue(event) {
  queue.push(event);
  if (scheduled) return;
  scheduled = true;
  // Charts with 10,000 points take a while to redraw: pausing in proportion keeps the page responsive and lets a
  // long backlog arrive as a few big batches instead of thousands of small ones.
  const pause = Math.min(MAX_PAUSE_MS, 2 * drawMs);
  setTimeout(() => {
    requestAnimationFrame(flush);
    fallback = setTimeout(flush, 250); // hidden tabs get no animation frames
  }, pause);
}

const connection = $("connection");
const socket = new RunEventSocket(run.id, {
  onEvent: enqueue,
  onState: (state, detail, code) => {
    connection.dataset.state = state;
    connection.textContent = detail ? `${state}: ${detail}` : state;
    if (code === 4401) toLogin();
    if (state === "live") refreshRun();
  },
});

// ---- REST: status after (re)connecting, actions, checkpoints ------------------------------------------

async function refreshRun() {
  try {
    const fresh = await getJSON(`/api/runs/${run.id}/`);
    cancelRequested = fresh.cancel_requested;
    setStatus(fresh.status);
    showQueue(fresh.queue);
  } catch { /* the socket is the main channel; a failed refresh changes nothing */ }
}
// A waiting run's place changes when other runs start or end, which its own events do not tell: ask while queued.
const QUEUE_REFRESH_MS = 10000;
setInterval(() => { if (status === "queued" && !document.hidden) refreshRun(); }, QUEUE_REFRESH_MS);

let lastCheckpointFetch = 0;
async function refreshCheckpoints() {
  lastCheckpointFetch = Date.now();
  try {
    const list = await getJSON(`/api/runs/${run.id}/checkpoints/`);
    const items = list.map((c) => el("li", {}, el("a", { href: c.download, download: "" },
      `iteration ${c.iteration}`), ` · ${formatBytes(c.size_bytes)}`));
    $("checkpoints").replaceChildren(...(items.length ? items : [el("li", { className: "muted" }, "none yet")]));
  } catch { /* keep the old list */ }
}
setInterval(() => {
  if (!FINISHED.has(status) && !document.hidden && Date.now() - lastCheckpointFetch > CHECKPOINT_REFRESH_MS) {
    refreshCheckpoints();
  }
}, CHECKPOINT_REFRESH_MS);

cancelButton.addEventListener("click", async () => {
  // No confirm(): a cancelled run keeps its checkpoints and can be cloned, and dialogs get in the way of scripts.
  actionErrors.hidden = true;
  cancelButton.disabled = true;
  try {
    const fresh = await postJSON(`/api/runs/${run.id}/cancel/`);
    cancelRequested = fresh.cancel_requested;
    setStatus(fresh.status);
  } catch (error) {
    renderErrors(actionErrors, error);
    cancelButton.disabled = FINISHED.has(status);
  }
});

cloneButton.addEventListener("click", async () => {
  actionErrors.hidden = true;
  cloneButton.disabled = true;
  try {
    const clone = await postJSON(`/api/runs/${run.id}/clone/`, {});
    location.assign(`/runs/${clone.id}/`);
  } catch (error) {
    renderErrors(actionErrors, error);
    cloneButton.disabled = false;
  }
});

// For people debugging in the console and for the browser tests.
window.earlRunPage = {
  pointCount: () => charts.pointCount(),
  lastSeq: () => socket.lastSeq,
  status: () => status,
  drawMs: () => drawMs,
  socket,
};
refreshCheckpoints();
showQueue(run.queue);
socket.start();
