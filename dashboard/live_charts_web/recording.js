// A recorded session's steps read once from the server's HTTP route
// (GET /api/sessions/{id}/steps, the component's `source`), page after page, rather than from
// a websocket: the Compare page's charts. The interface of Connection (start, stop, send) and
// its way of saying what state it is in: loading, loaded, refused (the server's words; not
// asked again) or retrying (unreachable or failing: asked again, from the page it stopped at).

import { ask } from "./reports.js";

const PAGE = 1000; // steps asked for at once (the route's default limit)
const RETRY_MS = 2000;

export class Recording {
  /** The first `maxSteps` steps at `url` (with the bearer `token`); `onSteps(steps)` gets
   * each page's, `onState(state, detail)` each change of state. */
  constructor(url, token, maxSteps, { onSteps, onState }) {
    this.url = url;
    this.token = token;
    this.maxSteps = maxSteps;
    this.onSteps = onSteps;
    this.onState = onState;
    this.received = 0;
    this.from = null; // the step the next page starts at (null: the first)
    this.stopped = false;
    this.timer = null;
  }

  start() {
    this.onState("loading", "");
    this.load();
    return this;
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
  }

  /** Nothing to send: a recording has no player to steer. */
  send() {
    return false;
  }

  async load() {
    while (this.received < this.maxSteps) {
      const url = new URL(this.url);
      url.searchParams.set("limit", String(Math.min(PAGE, this.maxSteps - this.received)));
      if (this.from !== null) url.searchParams.set("from", String(this.from));
      const answer = await ask(url.toString(), this.token);
      if (this.stopped) return;
      if (answer.error) {
        this.onState(answer.final ? "refused" : "retrying", answer.error);
        if (!answer.final) this.timer = setTimeout(() => this.load(), RETRY_MS);
        return;
      }
      let steps, next;
      try {
        ({ steps, next } = JSON.parse(answer.text));
        if (!Array.isArray(steps)) throw new Error("no steps in it");
      } catch (exc) {
        this.onState("refused", `cannot read the server's answer: ${exc.message}`);
        return;
      }
      this.received += steps.length;
      this.onSteps(steps);
      if (next === null || next === undefined || !steps.length) break;
      this.from = next;
    }
    this.onState("loaded", "");
  }
}
