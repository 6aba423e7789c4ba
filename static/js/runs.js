// Runs table: reads the filter form, asks /api/runs/ with the same parameters, keeps the URL in step.
import { el, formatTime, getJSON, renderErrors, statusBadge } from "./api.js";

const REFRESH_MS = 10000; // active runs change status; a light poll keeps the table honest
const PAGE_SIZE = 25;
const form = document.getElementById("run-filters");
const body = document.getElementById("runs-body");
const info = document.getElementById("page-info");
const prev = document.getElementById("page-prev");
const next = document.getElementById("page-next");
const errors = document.getElementById("runs-errors");
const compareRuns = document.getElementById("compare-runs");
const compareButton = document.getElementById("compare-selected");

let page = Number(new URLSearchParams(location.search).get("page")) || 1;
const selected = new Set();

function filters() {
  const params = new URLSearchParams();
  for (const [k, v] of new FormData(form)) if (String(v).trim()) params.set(k, String(v).trim());
  return params;
}

function row(run) {
  const check = el("input", { type: "checkbox", value: String(run.id), checked: selected.has(run.id),
    ariaLabel: `select run ${run.id}` });
  check.addEventListener("change", () => {
    check.checked ? selected.add(run.id) : selected.delete(run.id);
    updateCompare();
  });
  const total = run.total_iterations ?? "?";
  const pct = run.total_iterations ? Math.min(100, (100 * run.iterations_done) / run.total_iterations) : 0;
  const progress = el("div", { className: "progress", title: `${run.iterations_done} / ${total} iterations` },
    el("div", { className: "bar", style: `width:${pct.toFixed(0)}%` }),
    el("span", {}, `${run.iterations_done} / ${total}`));
  return el("tr", { dataset: { runId: String(run.id), status: run.status } },
    el("td", {}, check),
    el("td", {}, el("a", { href: `/runs/${run.id}/` }, String(run.id))),
    el("td", {}, el("a", { href: `/runs/${run.id}/` }, run.name)),
    el("td", {}, run.team_name),
    el("td", {}, run.owner),
    el("td", {}, statusBadge(run.status)),
    el("td", {}, progress),
    el("td", {}, run.priority),
    el("td", { title: run.created_at }, formatTime(run.created_at)));
}

function updateCompare() {
  compareRuns.value = [...selected].join(",");
  compareButton.disabled = selected.size < 2 || selected.size > 4;
  compareButton.textContent = `Compare selected (${selected.size})`;
}

async function load() {
  const params = filters();
  if (page > 1) params.set("page", String(page));
  history.replaceState(null, "", params.toString() ? `/?${params}` : "/");
  try {
    const data = await getJSON(`/api/runs/?${params}&page_size=${PAGE_SIZE}`);
    errors.hidden = true;
    body.replaceChildren(...data.results.map(row));
    if (!data.results.length) {
      body.append(el("tr", {}, el("td", { colSpan: 9, className: "muted" }, "No runs match.")));
    }
    const pages = Math.max(1, Math.ceil(data.count / PAGE_SIZE));
    info.textContent = `${data.count} run${data.count === 1 ? "" : "s"} · page ${page} of ${pages}`;
    info.dataset.count = String(data.count);
    prev.disabled = !data.previous;
    next.disabled = !data.next;
  } catch (error) {
    if (error.status === 404 && page > 1) { // the page vanished under a new filter: go back to the first
      page = 1;
      return load();
    }
    renderErrors(errors, error);
  }
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  page = 1;
  load();
});
for (const input of form.querySelectorAll("select")) input.addEventListener("change", () => { page = 1; load(); });
let typing;
form.querySelector("input[type=search]").addEventListener("input", () => {
  clearTimeout(typing);
  typing = setTimeout(() => { page = 1; load(); }, 300);
});
prev.addEventListener("click", () => { page = Math.max(1, page - 1); load(); });
next.addEventListener("click", () => { page += 1; load(); });
setInterval(() => { if (!document.hidden) load(); }, REFRESH_MS);
updateCompare();
load();
