// The run page's event log: newest first, bounded in the DOM, filterable; one line of text per event.
import { el, formatBytes } from "./api.js";

const KEEP = 1000; // events remembered for re-filtering
const SHOW = 300; // rows in the DOM (a long run has hundreds of thousands of events)
const FILTERS = {
  all: () => true,
  "no-moves": (e) => e.type !== "game.move",
  logs: (e) => ["log", "error", "run.status"].includes(e.type),
};
const HEADLINE_KEYS = ["rollout/win_rate", "rollout/reward_mean", "losses/policy_loss", "context/mean", "sft/loss"];

function layoutText(layout) {
  if (!layout) return "none";
  return Object.entries(layout).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ");
}

/** A one-line summary of an event's data. */
export function summary(e) {
  const d = e.data || {};
  switch (e.type) {
    case "run.status": return `${d.status}${d.message ? ` — ${d.message}` : ""}`;
    case "metrics": {
      const shown = HEADLINE_KEYS.filter((k) => k in (d.values || {}))
        .map((k) => `${k.split("/")[1]}=${Number(d.values[k]).toPrecision(3)}`);
      return `iteration ${d.iteration}: ${shown.join(" ") || `${Object.keys(d.values || {}).length} values`}`;
    }
    case "memory": return `iteration ${d.iteration}: ` + (d.workers || [])
      .map((w) => `${w.worker} ${formatBytes(w.used)}${w.budget ? ` / ${formatBytes(w.budget)}` : ""}`).join(", ");
    case "game.move": return `iteration ${d.iteration} game ${d.game} ply ${d.ply}: ${d.player} → ` +
      `${d.column === null ? "invalid" : `column ${d.column}`}`;
    case "game.end": return `iteration ${d.iteration} game ${d.game}: ${d.result} vs ${d.opponent} (reward ${d.reward})`;
    case "log": return d.message;
    case "error": return `${d.kind ? `${d.kind}: ` : ""}${d.message}`;
    case "selector.decision": return `${d.stage}: ${layoutText(d.old_layout)} → ${layoutText(d.new_layout)}` +
      ` (${d.switched ? "switched" : "kept"}) ${d.reason || ""}`;
    case "dispatch": return `iteration ${d.iteration}: moved ${formatBytes(d.bytes_moved)}, ` +
      `via driver ${formatBytes(d.bytes_via_driver)}, ${Number(d.seconds).toFixed(3)} s`;
    default: return JSON.stringify(d).slice(0, 200);
  }
}

export { layoutText };

export class EventLog {
  constructor(list, filterSelect) {
    this.list = list;
    this.kept = [];
    this.filter = FILTERS[filterSelect.value] || FILTERS.all;
    filterSelect.addEventListener("change", () => {
      this.filter = FILTERS[filterSelect.value] || FILTERS.all;
      this.list.replaceChildren();
      this.render(this.kept);
    });
  }

  row(e) {
    const level = e.type === "log" ? e.data.level : e.type === "error" ? "error" : "";
    const item = el("li", { className: `ev ev-${e.type.replace(".", "-")} ${level}`, value: e.seq,
      dataset: { seq: String(e.seq), type: e.type } },
      el("time", { dateTime: e.ts, title: e.ts }, (e.ts || "").slice(11, 19)),
      el("span", { className: "type" }, e.type),
      el("span", { className: "text" }, summary(e)));
    if (e.type === "error" && e.data.traceback) {
      item.append(el("details", {}, el("summary", {}, "traceback"), el("pre", {}, e.data.traceback)));
    }
    return item;
  }

  /** Prepend a batch (in seq order) so the newest is on top, then trim. */
  render(batch) {
    const shown = batch.filter(this.filter).slice(-SHOW);
    this.list.prepend(...shown.reverse().map((e) => this.row(e)));
    while (this.list.childElementCount > SHOW) this.list.lastElementChild.remove();
  }

  add(batch) {
    this.kept.push(...batch.slice(-KEEP));
    if (this.kept.length > KEEP) this.kept.splice(0, this.kept.length - KEEP);
    this.render(batch);
  }
}
