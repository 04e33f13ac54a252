// The live-charts component: on the page's render message it opens the websocket named by
// its arguments (or, for recorded sessions, reads each one's steps from the HTTP route named:
// recording.js, a column of panels each) and, once plotly.js is there, redraws the panels
// from its own rolling window a few times a second; below them it draws the reports its
// arguments name (reports.js), read from the server's HTTP routes. Python sends the
// arguments once; no frame and no report passes through it.

import { drawBands } from "./bands.js";
import { Charts } from "./draw.js";
import { CONNECTED, CONNECTING, Connection } from "./connection.js";
import { showControls } from "./controls.js";
import { Feed } from "./feed.js";
import { followHeight, onRender } from "./protocol.js";
import { Recording } from "./recording.js";
import { Reports } from "./reports.js";
import { showStatus } from "./status.js";
import { StepWindow } from "./window.js";

const TICK_MS = 150; // a new view, and each panel redrawn, at most this often: over 5 Hz
const IDLE_MS = 16; // how soon to look again when no panel was due
const $ = (id) => document.getElementById(id);

/** Why the charts cannot be drawn, if plotly.js (index.html's script tag) did not load. */
function plotlyFailure() {
  const tag = $("plotly");
  return tag.dataset.failed ? `cannot load plotly.js from ${tag.src}` : "";
}

/** The websocket address of an attempt: the token as a query parameter (browsers cannot set
 * headers on a websocket); a replay resumes after the last step it showed. */
function address(args, feed) {
  const url = new URL(args.source);
  if (args.token) url.searchParams.set("token", args.token);
  const latest = feed.window.latest;
  if (args.replay && latest) url.searchParams.set("from", String(latest.step + 1));
  return url.toString();
}

function element(tag, className, text = "") {
  const el = document.createElement(tag);
  el.className = className;
  el.textContent = text;
  return el;
}

/** Where each source is drawn: its status line, controls and panels. One source: the page's
 * own; recorded sessions (`args.sources`): a column each, side by side, under its title. */
function places(args) {
  if (!args.sources) return [{ status: $("status"), controls: $("controls"), panels: $("panels") }];
  const row = element("div", `row cols-${args.sources.length}`);
  const out = args.sources.map((_, i) => {
    const place = {
      status: element("div", "status"),
      controls: element("div", "controls"),
      panels: element("div", "panels"),
    };
    const column = element("div", "source");
    column.append(element("h3", "title", args.titles[i]), ...Object.values(place));
    row.append(column);
    return place;
  });
  $("panels").replaceChildren(row);
  return out;
}

/** One source's connection (or recording), window and redraw loop, until `stop`. */
class Session {
  constructor(args, source, place) {
    this.shown = args.shown;
    this.place = place;
    this.charts = new Charts(place.panels, args.panels || null);
    this.feed = new Feed(new StepWindow(args.max_steps));
    if (args.replay) this.feed.replay = { state: "playing", speed: args.speed }; // as it starts
    this.state = CONNECTING;
    this.detail = "";
    const onState = (state, detail) => {
      if (state === CONNECTED) performance.mark("connected");
      [this.state, this.detail] = [state, detail];
      this.status();
    };
    this.connection = args.recorded
      ? new Recording(source, args.token, args.max_steps, {
          onSteps: (steps) => this.feed.steps(steps),
          onState,
        })
      : new Connection(() => address(args, this.feed), {
          onText: (text) => this.feed.read(text),
          onState,
        });
    this.connection.start();
    showControls(place.controls, args, {
      onShown: (n) => {
        this.shown = n;
        this.feed.changed = true;
      },
      send: (msg) => this.connection.send(msg),
      onSeek: () => this.feed.seek(),
    });
    this.view = this.feed.window.view(this.shown);
    this.viewAt = -Infinity;
    this.status();
    // the next panel in a new task at once: a chain of setTimeout(0) is clamped to 4 ms a
    // link, 20 ms of every redraw of five panels
    this.next = new MessageChannel();
    this.next.port1.onmessage = () => this.loop();
    this.timer = setTimeout(() => this.loop(), 0);
  }

  /** A new view when something arrived and the last is TICK_MS old (at once for a knob
   * change, so that every panel draws its marker without waiting); then the panel on screen
   * most overdue redrawn, one a task: a click on the page waits for one panel at most, never
   * for a whole redraw. Nothing is drawn in a hidden tab. */
  loop() {
    const now = performance.now();
    const marked = this.feed.marked;
    if ((marked || now - this.viewAt >= TICK_MS) && this.feed.take()) {
      this.view = this.feed.window.view(this.shown);
      this.viewAt = now;
      this.charts.invalidate();
      this.status();
    }
    const drew =
      !document.hidden && window.Plotly && this.charts.drawNext(this.view);
    if (drew) this.next.port2.postMessage(null);
    else this.timer = setTimeout(() => this.loop(), IDLE_MS);
  }

  status() {
    const detail = [this.detail, plotlyFailure()].filter((x) => x).join(" · ");
    showStatus(this.place.status, this.state, detail, this.feed);
  }

  stop() {
    clearTimeout(this.timer);
    this.next.port1.close();
    this.connection.stop();
  }
}

let sessions = [];
let sessionsKey = null;
let reports = null;
let reportsKey = null;

/** The what-if preview's bands (`args.bands`), drawn once plotly.js is there. */
function showBands(rows) {
  if (window.Plotly) drawBands($("panels"), rows);
  else setTimeout(() => showBands(rows), IDLE_MS);
}

onRender((args) => {
  if (args.bands) {
    showBands(args.bands);
    return;
  }
  const asked = JSON.stringify([args.reports, args.token]);
  if (asked !== reportsKey) {
    if (reports) reports.stop();
    reports = new Reports($("reports"), args.reports, args.token);
    reportsKey = asked;
  }
  const sources = args.sources || [args.source];
  const key = JSON.stringify([sources, args.titles, args.panels, args.token, args.nonce]);
  if (key === sessionsKey) return;
  sessions.forEach((s) => s.stop());
  sessions = places(args).map((place, i) => new Session(args, sources[i], place));
  sessionsKey = key;
});
followHeight();
