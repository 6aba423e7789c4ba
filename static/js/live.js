// Websocket clients: a run's event stream that resumes after its last seq, and the cluster snapshot feed.
// Both reconnect with exponential backoff; close codes 4401/4404/4400 are final (sign in / no such run / bad URL).

const FINAL_CODES = { 4401: "not signed in", 4404: "no such run (or not your team's)", 4400: "bad request" };
const BASE_DELAY_MS = 500;
const MAX_DELAY_MS = 15000;
const PING_MS = 25000; // keeps idle proxies from dropping a quiet stream

function socketUrl(path) {
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${path}`;
}

class ReconnectingSocket {
  constructor({ onState = () => {} } = {}) {
    this.onState = onState;
    this.attempt = 0;
    this.stopped = false;
    this.ws = null;
  }

  path() {
    throw new Error("subclass must give the path");
  }

  start() {
    this.stopped = false;
    this.connect();
    return this;
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.retry);
    clearInterval(this.pinger);
    if (this.ws) this.ws.close(1000);
  }

  connect() {
    this.onState(this.attempt ? "reconnecting" : "connecting");
    const ws = new WebSocket(socketUrl(this.path()));
    this.ws = ws;
    ws.onopen = () => {
      this.onState("live");
      this.pinger = setInterval(() => this.send({ type: "ping" }), PING_MS);
    };
    ws.onmessage = (message) => {
      if (this.ws !== ws) return; // a socket we already gave up on
      this.attempt = 0; // a frame arrived: the link works, the next drop starts the backoff afresh
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch {
        return;
      }
      this.handle(frame);
    };
    ws.onclose = (event) => {
      clearInterval(this.pinger);
      if (this.ws !== ws || this.stopped) return;
      if (FINAL_CODES[event.code]) {
        this.onState("closed", FINAL_CODES[event.code], event.code);
        return;
      }
      // Full jitter: many tabs reconnecting after a server restart should not arrive all at once.
      const cap = Math.min(MAX_DELAY_MS, BASE_DELAY_MS * 2 ** this.attempt);
      const delay = cap / 2 + Math.random() * (cap / 2);
      this.attempt += 1;
      this.onState("waiting", `reconnecting in ${(delay / 1000).toFixed(1)} s`);
      this.retry = setTimeout(() => this.connect(), delay);
    };
  }

  send(message) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(message));
  }

  /** Drop the link on purpose and come back at once (used when a gap is seen). */
  reconnectNow() {
    const old = this.ws;
    this.ws = null;
    if (old) old.close(1000);
    clearInterval(this.pinger);
    this.connect();
  }
}

/**
 * A run's events in seq order, each exactly once, across reconnects: reconnects ask for ?after=<last seq>,
 * and anything at or below the last seq seen is dropped. Each event is handed to onEvent(envelope) once.
 */
export class RunEventSocket extends ReconnectingSocket {
  constructor(runId, { onEvent, onState, lastSeq = 0 } = {}) {
    super({ onState });
    this.runId = runId;
    this.lastSeq = lastSeq;
    this.onEvent = onEvent;
  }

  path() {
    return `/ws/runs/${this.runId}/?after=${this.lastSeq}`;
  }

  handle(frame) {
    if (typeof frame.seq !== "number") return; // pong / protocol.error frames carry no event
    if (frame.seq <= this.lastSeq) return; // already seen (overlap after a reconnect)
    if (frame.seq !== this.lastSeq + 1) {
      // The server never skips; if it happens anyway, resume from what we have rather than show a hole.
      this.reconnectNow();
      return;
    }
    this.lastSeq = frame.seq;
    this.onEvent(frame);
  }
}

/** The cluster page's feed: every frame is a full snapshot, so nothing needs resuming. */
export class ClusterSocket extends ReconnectingSocket {
  constructor({ onSnapshot, onState } = {}) {
    super({ onState });
    this.onSnapshot = onSnapshot;
  }

  path() {
    return "/ws/cluster/";
  }

  handle(frame) {
    if (frame.type === "cluster.snapshot") this.onSnapshot(frame.data);
  }

  refresh() {
    this.send({ type: "refresh" });
  }
}
