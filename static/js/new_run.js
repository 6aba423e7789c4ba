// New-run form: presets fill the JSON editor, JSON is checked as you type, the server's field errors are shown
// next to the field they name (name, team, priority) or under the editor (config.*), each with its allowed values.
import { ApiError, errorItem, postJSON, renderErrors } from "./api.js";

const form = document.getElementById("new-run");
const textarea = document.getElementById("config");
const nameInput = document.getElementById("name");
const team = document.getElementById("team");
const priority = document.getElementById("priority");
const status = document.getElementById("config-status");
const errors = document.getElementById("form-errors");
const submit = document.getElementById("submit-run");
const presets = JSON.parse(document.getElementById("presets-data").textContent);

/** The parsed config, or null after showing where the JSON is broken. */
function parseConfig() {
  const text = textarea.value.trim();
  if (!text) {
    showStatus("error", "The config is empty: write a JSON object ({} takes every default).");
    return null;
  }
  try {
    const value = JSON.parse(text);
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      showStatus("error", "The config must be a JSON object, like {\"iterations\": 2}.");
      return null;
    }
    showStatus("ok", `Valid JSON · ${Object.keys(value).length} top-level field(s)`);
    return value;
  } catch (e) {
    showStatus("error", `JSON syntax: ${e.message}${lineHint(text, e.message)}`);
    return null;
  }
}

// Browsers report a character position; a line number is what a person can find.
function lineHint(text, message) {
  const m = /position (\d+)/.exec(message);
  if (!m) return "";
  const before = text.slice(0, Number(m[1]));
  return ` (line ${before.split("\n").length})`;
}

function showStatus(kind, message) {
  status.textContent = message;
  status.className = kind === "error" ? "error-text" : "ok-text";
  textarea.classList.toggle("invalid", kind === "error");
}

function clearErrors() {
  errors.hidden = true;
  errors.replaceChildren();
  for (const span of form.querySelectorAll(".field-error")) span.replaceChildren();
  for (const input of form.querySelectorAll(".invalid")) input.classList.remove("invalid");
}

/** Every error goes in the list; those about a form field also appear right under that field. */
function showServerErrors(error) {
  renderErrors(errors, error);
  if (!(error instanceof ApiError)) return;
  for (const e of error.errors) {
    const target = form.querySelector(`.field-error[data-for="${CSS.escape(e.field || "")}"]`);
    if (target) {
      target.append(errorItem(e));
      document.getElementById(e.field)?.classList.add("invalid");
    } else if ((e.field || "").startsWith("config")) {
      textarea.classList.add("invalid");
    }
  }
}

function usePreset(key) {
  const config = presets[key];
  if (!config) return;
  textarea.value = JSON.stringify(config, null, 2);
  if (config.name) nameInput.value = config.name;
  for (const b of document.querySelectorAll(".preset")) b.classList.toggle("active", b.dataset.preset === key);
  clearErrors();
  parseConfig();
}

for (const button of document.querySelectorAll(".preset")) {
  button.addEventListener("click", () => usePreset(button.dataset.preset));
}

let typing;
textarea.addEventListener("input", () => {
  clearTimeout(typing);
  typing = setTimeout(parseConfig, 250);
});

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors();
  const config = parseConfig();
  if (config === null) {
    renderErrors(errors, new ApiError(400, { detail: "invalid input",
      errors: [{ field: "config", message: status.textContent, allowed: "a JSON object" }] }));
    return;
  }
  const payload = { team: team.value, priority: priority.value, config };
  if (nameInput.value.trim()) payload.name = nameInput.value.trim();
  submit.disabled = true;
  submit.textContent = "Launching…";
  try {
    const run = await postJSON("/api/runs/", payload);
    location.assign(`/runs/${run.id}/`);
  } catch (error) {
    showServerErrors(error);
    submit.disabled = false;
    submit.textContent = "Launch run";
  }
});

// Keyboard users expect Ctrl/Cmd+Enter to submit from the editor.
textarea.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
});

const first = document.querySelector(".preset");
if (first) first.classList.add("active");
parseConfig();
