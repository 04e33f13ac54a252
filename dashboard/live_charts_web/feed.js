// What the server's messages mean: a message is one step, a bundle (a JSON array) of steps,
// an error `{error}` or, on a replay socket, the player's state `{replay}`; a recording's
// pages (recording.js) bring steps too. Steps go into the window; what cannot be read is
// skipped and counted, never drawn.

export class Feed {
  constructor(window) {
    this.window = window;
    this.received = 0; // steps taken into the window
    this.dropped = 0; // steps the server dropped for this client (its `dropped` field)
    this.malformed = 0; // messages or steps skipped because they could not be read
    this.error = ""; // the server's last error message
    this.replay = null; // the replay player's last state
    this.changed = false; // whether anything arrived since the last `take`
    this.marked = false; // whether a knob change arrived since the last `take`
    this.seeking = false; // a seek was sent: steps are stale until the player's answer
  }

  /** Empties the window for a seek; the steps already on their way are skipped. */
  seek() {
    this.window.clear();
    this.seeking = true;
    this.changed = true;
  }

  /** One websocket message as text. */
  read(text) {
    let msg;
    try {
      msg = JSON.parse(text);
    } catch {
      this.malformed += 1;
      return;
    }
    this.changed = true;
    if (Array.isArray(msg)) {
      this.steps(msg);
    } else if (msg && typeof msg === "object" && "replay" in msg) {
      this.replay = msg.replay;
      this.seeking = false;
    } else if (msg && typeof msg === "object" && "error" in msg && !("step" in msg)) {
      this.error = String(msg.error);
    } else {
      this.add(msg);
    }
  }

  /** Steps: a bundle, or a page of a recording (recording.js). */
  steps(frames) {
    this.changed = true;
    frames.forEach((frame) => this.add(frame));
  }

  add(frame) {
    if (this.seeking) return;
    try {
      this.window.add(frame);
    } catch {
      this.malformed += 1;
      return;
    }
    this.dropped += frame.dropped || 0;
    this.received += 1;
    if (frame.knob_changes && frame.knob_changes.length) this.marked = true;
  }

  /** Whether anything arrived since the last call. */
  take() {
    const changed = this.changed;
    this.changed = false;
    this.marked = false;
    return changed;
  }
}
