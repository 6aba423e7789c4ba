// Compare page: each run's metrics from /api/runs/<id>/metrics/, one chart per metric key, one trace per run.
/* global Plotly */
import { el, getJSON, renderErrors } from "./api.js";
import { PLOT_CONFIG, plotLayout } from "./charts.js";

const DEFAULT_KEYS = [
  "rollout/win_rate", "rollout/reward_mean", "losses/policy_loss", "losses/kl",
  "perf/rollout_tokens_per_s", "context/mean", "context/max", "rollout/invalid_rate",
];
const runs = JSON.parse(document.getElementById("compare-data").textContent);
const container = document.getElementById("charts");
const statusLine = document.getElementById("compare-status");
const extra = document.getElementById("extra-metric");
const series = new Map(); // run id -> Map(key -> {x, y})
const drawn = new Set();

function seriesOf(rows) {
  const byKey = new Map();
  for (const row of rows) {
    for (const [key, value] of Object.entries(row.values)) {
      if (key.startsWith("sft/")) continue; // warm-start epochs would share the iteration axis; compare RL only
      let s = byKey.get(key);
      if (!s) byKey.set(key, (s = { x: [], y: [] }));
      s.x.push(row.iteration);
      s.y.push(value);
    }
  }
  return byKey;
}

function chartName(key) {
  return key.replace(/[^a-z0-9]+/gi, "_");
}

function drawChart(key) {
  if (drawn.has(key)) return;
  drawn.add(key);
  const traces = runs.map((r) => {
    const s = series.get(r.id)?.get(key) || { x: [], y: [] };
    return { type: "scatter", mode: s.x.length > 200 ? "lines" : "lines+markers", marker: { size: 4 },
      name: `#${r.id} ${r.name}`, x: s.x, y: s.y };
  });
  const div = el("div", { className: "plot", dataset: { chart: chartName(key), key,
    points: String(Math.max(...traces.map((t) => t.x.length))) } });
  container.append(el("figure", { className: "chart" }, el("figcaption", {}, key), div));
  Plotly.newPlot(div, traces, plotLayout(), PLOT_CONFIG);
}

async function main() {
  const results = await Promise.allSettled(runs.map((r) => getJSON(`/api/runs/${r.id}/metrics/`)));
  const failed = [];
  results.forEach((res, i) => {
    if (res.status === "fulfilled") series.set(runs[i].id, seriesOf(res.value.metrics));
    else failed.push(res.reason);
  });
  if (failed.length) renderErrors(statusLine, failed[0]);
  const keys = new Set([...series.values()].flatMap((m) => [...m.keys()]));
  const points = Math.max(0, ...[...series.values()].flatMap((m) => [...m.values()].map((s) => s.x.length)));
  container.dataset.points = String(points);
  if (!failed.length) {
    statusLine.textContent = keys.size ? "" : "No metrics reported yet by these runs.";
  }
  for (const key of DEFAULT_KEYS) if (keys.has(key)) drawChart(key);
  for (const key of [...keys].sort()) {
    if (!DEFAULT_KEYS.includes(key)) extra.append(el("option", { value: key }, key));
  }
}

extra.addEventListener("change", () => {
  if (extra.value) drawChart(extra.value);
  extra.value = "";
});

main();
