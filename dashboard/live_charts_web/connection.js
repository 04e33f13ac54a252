// A websocket that reconnects by itself, with backoff, and says what state it is in:
// connecting (never connected yet), connected, reconnecting (lost, retrying), server gone
// (nothing answered for a while; still retrying) or refused (the server closed the socket
// with a policy violation, e.g. a wrong API key: its reason is kept; retried slowly).

export const CONNECTING = "connecting";
export const CONNECTED = "connected";
const RECONNECTING = "reconnecting";
const GONE = "server gone";
const REFUSED = "refused";

const POLICY_VIOLATION = 1008; // the close code of the server's refusals

export class Connection {
  /** `url()` gives the address of each attempt (a replay resumes where it was); `onText`
   * gets each message; `onState(state, detail)` each change of state. */
  constructor(url, { onText, onState }, { goneAfterMs = 5000, maxBackoffMs = 2000 } = {}) {
    this.url = url;
    this.onText = onText;
    this.onState = onState;
    this.goneAfterMs = goneAfterMs;
    this.maxBackoffMs = maxBackoffMs;
    this.state = CONNECTING;
    this.ws = null;
    this.timer = null;
    this.stopped = false;
    this.backoffMs = 100;
    this.lostAt = Date.now();
  }

  start() {
    this.open();
    return this;
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.ws) this.ws.close();
  }

  /** Sends `msg` as JSON; false when not connected. */
  send(msg) {
    if (this.state !== CONNECTED) return false;
    this.ws.send(JSON.stringify(msg));
    return true;
  }

  open() {
    const ws = new WebSocket(this.url());
    this.ws = ws;
    ws.onopen = () => {
      this.backoffMs = 100;
      this.setState(CONNECTED, "");
    };
    ws.onmessage = (event) => this.onText(event.data);
    ws.onclose = (event) => {
      if (this.stopped || ws !== this.ws) return;
      this.lost(event);
    };
  }

  lost(event) {
    const wasConnected = this.state === CONNECTED;
    if (wasConnected) this.lostAt = Date.now();
    let delay = this.backoffMs;
    if (event.code === POLICY_VIOLATION) {
      this.setState(REFUSED, event.reason || "the server refused the connection");
      delay = this.maxBackoffMs * 2;
    } else if (Date.now() - this.lostAt > this.goneAfterMs) {
      this.setState(GONE, `nothing answers at ${shown(this.url())}; retrying`);
    } else if (wasConnected || this.state !== CONNECTING) {
      this.setState(RECONNECTING, "connection lost; retrying");
    }
    this.backoffMs = Math.min(this.backoffMs * 2, this.maxBackoffMs);
    this.timer = setTimeout(() => this.open(), delay);
  }

  setState(state, detail) {
    this.state = state;
    this.onState(state, detail);
  }
}

/** The address without its token, to show on the page. */
function shown(url) {
  const u = new URL(url);
  u.searchParams.delete("token");
  return u.toString();
}
