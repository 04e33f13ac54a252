// The autopilot, as pure functions of GET /api/autopilot's answer: its state in words, its
// SLO chart (measured p90 TTFT and TPOT against dashed target lines, and SLO attainment) and
// its latest decisions as table rows.

import { figure, secondaryY } from "./figure.js";

const TTFT_COLOUR = "#1f77b4";
const TPOT_COLOUR = "#ff7f0e";
const ATTAINMENT_COLOUR = "#2ca02c";

/** "adjusting: why" (the state and its note). */
export function stateLine(status) {
  return `${status.state}: ${status.note || "–"}`;
}

/** Whether there is a chart to draw: on, and with something measured. */
export function measuring(status) {
  return Boolean(status.settings.enabled && (status.history || []).length);
}

function line(x, y, name, color, extra = {}) {
  return { type: "scatter", mode: "lines", x, y, name, line: { color }, ...extra };
}

function target(y, color) {
  return {
    type: "line",
    xref: "paper",
    x0: 0,
    x1: 1,
    y0: y,
    y1: y,
    line: { color, dash: "dash" },
  };
}

/** p90 TTFT and TPOT (ms, left axis, log) with dashed target lines, attainment (right). */
export function sloFigure(status) {
  const history = status.history || [];
  const { settings } = status;
  const t0 = history.length ? history[0].t : 0;
  const x = history.map((h) => h.t - t0);
  const data = [
    line(x, history.map((h) => h.ttft_p90_ms), "p90 TTFT ms", TTFT_COLOUR),
    line(x, history.map((h) => h.tpot_p90_ms), "p90 TPOT ms", TPOT_COLOUR),
    line(x, history.map((h) => h.attainment), "SLO attainment", ATTAINMENT_COLOUR, {
      yaxis: "y2",
    }),
  ];
  return figure(data, "SLO: measured p90 against the targets (dashed)", "ms", "seconds", {}, {
    yaxis: { type: "log" },
    yaxis2: secondaryY("attainment", { range: [0, 1.05], tickformat: ".0%" }),
    shapes: [
      target(settings.ttft_p90_ms, TTFT_COLOUR),
      target(settings.tpot_p90_ms, TPOT_COLOUR),
    ],
    margin: { r: 60 },
  });
}

/** The latest decisions, newest first: what it did, the version, the change and why. */
export function decisionRows(status, limit = 10) {
  return (status.decisions || []).slice(0, limit).map((d) => ({
    action: d.refused ? `${d.action} (refused)` : d.action,
    version: d.version === null || d.version === undefined ? "–" : String(d.version),
    change: Object.entries(d.changes || {})
      .map(([k, [a, b]]) => `${k} ${a}→${b}`)
      .join(", "),
    why: d.refused || d.reason,
  }));
}
