// Panels read from the server's HTTP routes rather than a websocket: the "Why slow?" report
// and the autopilot's state. Each is asked for every few seconds while the tab is shown (or
// once, `every_s` 0) and redrawn only when its answer changed; a refusal or an unreachable
// server is shown in its place, and asking goes on.

import { decisionRows, measuring, sloFigure, stateLine } from "./autopilot.js";
import { react } from "./draw.js";
import { causeBars, headline, waterfall } from "./why_slow.js";

const RETRY_MS = 5000; // a one-off report not read yet (unreachable, hidden) is asked again
const PLOTLY_WAIT_MS = 100;

/** GET `url` with the bearer `token`: {text} or {error, final} (final: the server refused,
 * asking again will not help a one-off report). */
export async function ask(url, token) {
  let resp;
  try {
    resp = await fetch(url, { headers: token ? { Authorization: `Bearer ${token}` } : {} });
  } catch (exc) {
    return { error: `server unreachable (${url}): ${exc.message}`, final: false };
  }
  const text = await resp.text();
  if (resp.ok) return { text };
  let message = text || resp.statusText;
  try {
    message = JSON.parse(text).error.message;
  } catch {
    // not the server's JSON error: its text as it is
  }
  return { error: `${resp.status}: ${message}`, final: resp.status < 500 };
}

function element(tag, className = "", text = "") {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text) el.textContent = text;
  return el;
}

/** A chart's div, drawn with `react` (draw.js), which counts its draws. */
function chart(name) {
  const div = element("div", "chart");
  div.dataset.chart = name;
  div.dataset.draws = "0";
  return div;
}

function table(rows) {
  const out = element("table");
  const head = out.createTHead().insertRow();
  for (const name of Object.keys(rows[0])) head.append(element("th", "", name));
  const body = out.createTBody();
  for (const row of rows) {
    const tr = body.insertRow();
    for (const value of Object.values(row)) tr.insertCell().textContent = value;
  }
  return out;
}

/** The "Why slow?" panel: the causes in words, TTFT and TPOT by cause, the waterfall. */
class WhySlow {
  constructor(body, spec) {
    this.scope = spec.scope;
    this.words = element("div", "headline");
    this.charts = { ttft: chart("ttft"), tpot: chart("tpot"), waterfall: chart("waterfall") };
    const pair = element("div", "row cols-2");
    pair.append(this.charts.ttft, this.charts.tpot);
    this.figures = element("div");
    this.figures.append(pair, this.charts.waterfall);
    body.append(this.words, this.figures);
  }

  show(report) {
    this.words.replaceChildren(
      element("div", "caption", `${report.requests} requests ${this.scope}`),
      ...headline(report).map((text) => element("p", "cause", text)),
    );
    this.figures.hidden = !report.requests;
    if (!report.requests) return;
    react(this.charts.ttft, causeBars(report, "ttft"));
    react(this.charts.tpot, causeBars(report, "tpot"));
    react(this.charts.waterfall, waterfall(report));
  }
}

/** The autopilot: its state and why; while it is on and has measured, its SLO chart and
 * latest decisions. */
class Autopilot {
  constructor(body) {
    this.state = element("div", "caption");
    this.slo = chart("slo");
    this.decisions = element("div", "decisions");
    this.figures = element("div");
    this.figures.append(this.slo, this.decisions);
    body.append(this.state, this.figures);
  }

  show(status) {
    this.state.textContent = stateLine(status);
    this.figures.hidden = !measuring(status);
    if (this.figures.hidden) return;
    react(this.slo, sloFigure(status));
    const rows = decisionRows(status);
    this.decisions.replaceChildren(...(rows.length ? [table(rows)] : []));
  }
}

const KINDS = { why_slow: WhySlow, autopilot: Autopilot };

/** One report's section: its title, its content, and a line saying why it cannot be read. */
class Report {
  constructor(root, spec, token) {
    this.spec = spec;
    this.token = token;
    this.section = element("section", "report");
    this.section.dataset.report = spec.name;
    this.section.dataset.answers = "0";
    this.problem = element("div", "detail");
    const body = element("div");
    this.view = new KINDS[spec.name](body, spec);
    this.section.append(element("h3", "", spec.title), this.problem, body);
    root.append(this.section);
    this.last = null;
    this.stopped = false;
    this.timer = setTimeout(() => this.poll(), 0);
  }

  async poll() {
    let again = this.spec.every_s * 1000;
    if (document.hidden) {
      again = again || RETRY_MS; // a one-off report is asked for once the tab is shown
    } else {
      const answer = await ask(this.spec.url, this.token);
      if (this.stopped) return;
      this.section.dataset.answers = String(Number(this.section.dataset.answers) + 1);
      if (answer.error) {
        this.problem.textContent = answer.error;
        this.section.dataset.state = "error";
        if (!again && !answer.final) again = RETRY_MS;
      } else {
        this.problem.textContent = "";
        this.section.dataset.state = "ok";
        await this.shown(answer.text);
      }
    }
    if (again && !this.stopped) this.timer = setTimeout(() => this.poll(), again);
  }

  /** Draws an answer unless it is the last one again, once plotly.js is there. */
  async shown(text) {
    if (text === this.last) return;
    while (!window.Plotly && !this.stopped) {
      await new Promise((done) => setTimeout(done, PLOTLY_WAIT_MS));
    }
    this.last = text;
    try {
      this.view.show(JSON.parse(text));
    } catch (exc) {
      this.problem.textContent = `cannot draw the server's answer: ${exc.message}`;
      this.section.dataset.state = "error";
    }
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
  }
}

/** The reports named by the component's arguments, drawn into `root` until `stop`. */
export class Reports {
  constructor(root, specs, token) {
    root.replaceChildren();
    this.reports = (specs || []).map((spec) => new Report(root, spec, token));
  }

  stop() {
    for (const report of this.reports) report.stop();
  }
}
