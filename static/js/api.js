// Small helpers shared by the pages: same-origin fetch with the session cookie and CSRF header, error display.

/** The CSRF token the server put in the page (the cookie may be HttpOnly in some deployments). */
export function csrfToken() {
  const meta = document.querySelector('meta[name="csrf-token"]');
  return meta ? meta.content : "";
}

/** An API failure with the parsed body ({"detail", "errors": [{field, message, allowed}]}) when there is one. */
export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.detail) || `request failed (HTTP ${status})`);
    this.status = status;
    this.body = body || {};
  }
  get errors() {
    return Array.isArray(this.body.errors) ? this.body.errors : [];
  }
}

async function request(method, url, payload) {
  const headers = { Accept: "application/json" };
  const init = { method, headers, credentials: "same-origin" };
  if (method !== "GET") headers["X-CSRFToken"] = csrfToken();
  if (payload !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(payload);
  }
  const response = await fetch(url, init);
  if (response.status === 401) toLogin(); // the session expired; nothing on the page works without it
  const body = await peekJson(response);
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

async function peekJson(response) {
  try {
    return await response.json();
  } catch {
    return null;
  }
}

export function toLogin() {
  location.assign(`/login/?next=${encodeURIComponent(location.pathname + location.search)}`);
}

export const getJSON = (url) => request("GET", url);
export const postJSON = (url, payload = {}) => request("POST", url, payload);

/** "allowed" comes as a string, a list, or null. */
export function allowedText(allowed) {
  if (allowed === null || allowed === undefined || allowed === "") return "";
  return Array.isArray(allowed) ? allowed.join(", ") : String(allowed);
}

/** One <li> per error: "field: message (allowed: ...)"; never innerHTML, the texts come from user input. */
export function renderErrors(container, error) {
  container.replaceChildren();
  const items = error instanceof ApiError && error.errors.length
    ? error.errors
    : [{ field: "", message: error.message || String(error), allowed: null }];
  const heading = document.createElement("p");
  heading.textContent = error instanceof ApiError ? error.message : "Something went wrong";
  const list = document.createElement("ul");
  for (const e of items) list.append(errorItem(e));
  container.append(heading, list);
  container.hidden = false;
}

export function errorItem(e) {
  const li = document.createElement("li");
  li.dataset.field = e.field || "";
  if (e.field) {
    const code = document.createElement("code");
    code.textContent = e.field;
    li.append(code, ": ");
  }
  li.append(e.message);
  const allowed = allowedText(e.allowed);
  if (allowed) {
    const hint = document.createElement("span");
    hint.className = "allowed";
    hint.textContent = ` (allowed: ${allowed})`;
    li.append(hint);
  }
  return li;
}

/** A status badge element, styled per status by the CSS. */
export function statusBadge(status) {
  const span = document.createElement("span");
  span.className = `badge status-${status}`;
  span.textContent = status;
  return span;
}

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "dataset") Object.assign(node.dataset, v);
    else if (k in node) node[k] = v;
    else node.setAttribute(k, v);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

export function formatTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

export function formatBytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = Number(n);
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}
