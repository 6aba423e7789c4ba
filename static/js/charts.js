// Live Plotly charts that only ever append: points are queued as events arrive and written with one
// Plotly.extendTraces call per chart per flush (the page flushes once per animation frame), so a backlog of
// 10,000 iterations costs a handful of redraws, not 10,000.
/* global Plotly */

const GIB = 1024 ** 3;
const MARKERS_UNTIL = 200; // markers make single points visible; past this many, lines alone stay fast
const PERF_RATE = /^perf\/.*tokens_per_s$/;

/** The run page's charts; `match(key)` picks the metric keys a chart shows (keys are namespaced, CleanRL style). */
export const RUN_CHARTS = [
  { name: "win_rate", title: "Reward and win rate",
    match: (k) => ["rollout/win_rate", "rollout/reward_mean", "rollout/draw_rate", "rollout/invalid_rate"].includes(k) },
  { name: "losses", title: "Losses", match: (k) => k === "losses/policy_loss" || k === "losses/kl" },
  { name: "tokens_per_s", title: "Throughput (tokens/s)", match: (k) => PERF_RATE.test(k) },
  { name: "context", title: "Context length (tokens)",
    match: (k) => ["context/mean", "context/max", "context/final_mean"].includes(k) },
  { name: "context_turns", title: "Context length per turn (mean)", optional: true,
    match: (k) => /^context\/turn_?\d+_mean$/.test(k) },
  { name: "memory", title: "Memory per worker (GiB) vs budget", yTitle: "GiB" },
  { name: "layouts", title: "Selector: micro-batch per stage, trainer and rollout-engine TP degree (a step = a switch)",
    optional: true, match: (k) => /^selector\/(.*_micro_batch|train_tp|rollout_tp)$/.test(k) },
  { name: "optimizer", title: "Optimizer", optional: true,
    match: (k) => ["losses/clip_frac", "losses/ratio_mean", "losses/grad_norm"].includes(k) },
  { name: "dispatch", title: "Data dispatch: bytes moved to the trainer and bytes through the driver", optional: true,
    yTitle: "bytes", match: (k) => k === "dispatch/bytes_moved" || k === "dispatch/bytes_via_driver" },
  { name: "timing", title: "Stage times (s)", optional: true, match: (k) => /^perf\/.*_s$/.test(k) && !PERF_RATE.test(k) },
  { name: "warm_start", title: "Warm start (SFT) loss by epoch", optional: true, xTitle: "epoch",
    match: (k) => k === "sft/loss" },
];

/** "rollout/win_rate" -> "win_rate", "context/turn03_mean" -> "turn 3". */
export function traceLabel(key) {
  const turn = /^context\/turn_?(\d+)_mean$/.exec(key);
  if (turn) return `turn ${Number(turn[1])}`;
  return key.includes("/") ? key.slice(key.indexOf("/") + 1) : key;
}

export function plotLayout({ xTitle = "iteration", yTitle = "" } = {}) {
  return {
    margin: { l: 50, r: 10, t: 28, b: 40 }, height: 260, showlegend: true,
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    xaxis: { title: { text: xTitle } }, yaxis: { title: { text: yTitle } },
    uirevision: "keep", // a user's zoom survives appends
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { size: 11 },
  };
}

export const PLOT_CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["sendDataToCloud"] };

/** One chart: queued points per trace key, written on flush(). */
export class LiveChart {
  constructor(div, spec) {
    this.div = div;
    this.spec = spec;
    this.index = new Map(); // trace key -> Plotly trace index
    this.pending = new Map(); // trace key -> {x: [], y: [], style}
    this.lengths = new Map(); // trace key -> points plotted
    this.plotted = null; // the promise of the chain of Plotly calls, once the plot exists
    this.markers = true;
    div.dataset.points = "0";
  }

  push(key, x, y, style = {}) {
    let p = this.pending.get(key);
    if (!p) this.pending.set(key, (p = { x: [], y: [], style }));
    p.x.push(x);
    p.y.push(y);
  }

  /** Write the queued points; resolves when Plotly has drawn them. */
  flush() {
    if (!this.pending.size) return this.plotted || Promise.resolve();
    const extend = { x: [], y: [] };
    const extendAt = [];
    const fresh = [];
    for (const [key, p] of this.pending) {
      this.lengths.set(key, (this.lengths.get(key) || 0) + p.x.length);
      if (this.index.has(key)) {
        extendAt.push(this.index.get(key));
        extend.x.push(p.x);
        extend.y.push(p.y);
      } else {
        this.index.set(key, this.index.size); // addTraces appends, so indices follow insertion order
        fresh.push({ type: "scatter", mode: this.markers ? "lines+markers" : "lines", marker: { size: 4 },
          name: traceLabel(key), x: p.x, y: p.y, ...p.style });
      }
    }
    this.pending.clear();
    const longest = Math.max(...this.lengths.values());
    const thin = this.markers && longest > MARKERS_UNTIL;
    if (thin) this.markers = false;
    this.div.dataset.points = String(longest);
    const draw = () => {
      const steps = [];
      if (extendAt.length) steps.push(Plotly.extendTraces(this.div, extend, extendAt));
      if (fresh.length) steps.push(Plotly.addTraces(this.div, fresh));
      if (thin) steps.push(Plotly.restyle(this.div, { mode: "lines" }));
      return Promise.all(steps);
    };
    if (!this.plotted) {
      this.div.classList.remove("empty");
      this.div.replaceChildren();
      this.plotted = Plotly.newPlot(this.div, [], plotLayout(this.spec), PLOT_CONFIG);
    }
    // Plotly calls must not interleave with newPlot's, so each flush waits for the previous one.
    this.plotted = this.plotted.then(draw, draw);
    return this.plotted;
  }
}

/** The charts of a run page, fed by metrics and memory events. */
export class ChartSet {
  constructor(container, specs = RUN_CHARTS) {
    this.container = container;
    this.charts = specs.map((spec) => {
      const box = document.createElement("figure");
      box.className = "chart" + (spec.optional ? " optional" : "");
      const caption = document.createElement("figcaption");
      caption.textContent = spec.title;
      const div = document.createElement("div");
      div.dataset.chart = spec.name;
      div.className = "plot empty";
      div.textContent = "waiting for data…";
      box.append(caption, div);
      container.append(box);
      return new LiveChart(div, spec);
    });
    this.byName = Object.fromEntries(this.charts.map((c) => [c.spec.name, c]));
    this.metricEvents = 0;
    this.queuedEvents = 0;
    container.dataset.points = "0";
  }

  addMetrics(iteration, values) {
    this.queuedEvents += 1;
    for (const [key, value] of Object.entries(values)) {
      if (typeof value !== "number") continue;
      for (const chart of this.charts) if (chart.spec.match && chart.spec.match(key)) chart.push(key, iteration, value);
    }
  }

  addMemory(iteration, workers) {
    const chart = this.byName.memory;
    for (const w of workers) {
      const group = { legendgroup: w.worker };
      chart.push(`${w.worker} used`, iteration, w.used / GIB, group);
      if (w.budget) chart.push(`${w.worker} budget`, iteration, w.budget / GIB, { ...group, line: { dash: "dash" } });
    }
  }

  flush() {
    const drawn = Promise.all(this.charts.map((chart) => chart.flush()));
    this.metricEvents += this.queuedEvents;
    this.queuedEvents = 0;
    this.container.dataset.points = String(this.metricEvents);
    return drawn;
  }

  /** How many metrics events are plotted (what a browser test waits for). */
  pointCount() {
    return this.metricEvents;
  }
}
