// The "Why slow?" figures from an attribution report (GET /api/attribution or
// /api/sessions/{id}/attribution): TTFT and TPOT by cause over time, and a waterfall of the
// latest requests by phase. Pure functions: every number comes from the server.

import { colour, ordered, phaseColour } from "./causes.js";
import { figure } from "./figure.js";

export const METRICS = { ttft: "TTFT", tpot: "TPOT" };
const BARS_HEIGHT = 420; // room below the plot for a legend of long cause names
const ROW_PX = 14; // waterfall height per request

/** The dominant cause of p90 TTFT and of p90 TPOT, in the server's words. */
export function headline(report) {
  return Object.values(report.dominant || {})
    .filter((d) => d)
    .map((d) => d.text);
}

function label(report, cause) {
  return (report.causes || {})[cause] || cause;
}

/** The unix time both figures count seconds from: the earliest bucket or arrival shown. */
function origin(report) {
  const starts = [...report.over_time.map((b) => b.t0), ...report.recent.map((t) => t.arrival)];
  return starts.length ? Math.min(...starts) : report.from || 0;
}

function secondsAfter(t0) {
  return `s after ${new Date(t0 * 1000).toLocaleTimeString("en-GB", { hour12: false })}`;
}

/** Mean `metric` ("ttft" or "tpot") ms by cause of the requests that ended in each bucket,
 * stacked, so that a bar is as high as the bucket's mean. */
export function causeBars(report, metric) {
  const buckets = report.over_time;
  const t0 = origin(report);
  const causes = new Set(buckets.flatMap((b) => Object.keys(b[metric])));
  const bars = ordered(causes).map((cause) => ({
    type: "bar",
    x: buckets.map((b) => (b.t0 + b.t1) / 2 - t0),
    y: buckets.map((b) => b[metric][cause] || 0),
    width: buckets.map((b) => b.t1 - b.t0),
    customdata: buckets.map((b) => b.requests),
    name: label(report, cause),
    marker: { color: colour(cause) },
    hovertemplate: "%{fullData.name}: %{y:.1f} ms (mean of %{customdata} requests)<extra></extra>",
  }));
  const name = METRICS[metric];
  return figure(bars, `${name} by cause`, `mean ${name} ms`, secondsAfter(t0), {}, {
    barmode: "stack",
    height: BARS_HEIGHT,
  });
}

function ms(value) {
  return value === null || value === undefined ? "–" : `${value.toFixed(1)} ms`;
}

/** A request's hover text: its TTFT and TPOT, each split by cause in ms, largest first. */
export function breakdown(report, t) {
  const tpot = Object.values(t.tpot);
  const totals = { ttft: t.ttft_ms, tpot: tpot.length ? tpot.reduce((a, b) => a + b) : null };
  const lines = [`<b>${t.req}</b>: E2E ${ms(t.e2e_ms)}, ${t.output_len} tokens`];
  for (const [metric, name] of Object.entries(METRICS)) {
    lines.push(`${name} ${ms(totals[metric])}`);
    const parts = Object.entries(t[metric]).sort((a, b) => b[1] - a[1]);
    lines.push(...parts.map(([cause, v]) => `   ${label(report, cause)} ${ms(v)}`));
  }
  return lines.join("<br>");
}

/** A timeline's phases as bars [phase, a wait's cause, start, end], one for each run of
 * touching phases of the same colour: a decode's steps alternate with the loop's overhead
 * between them, both drawn as decode, so one bar rather than two a step. */
export function runs(phases) {
  const out = [];
  for (const p of phases) {
    const cause = p.phase === "waiting" ? p.cause : null;
    const last = out[out.length - 1];
    if (last && last[0] === p.phase && last[1] === cause && Math.abs(last[3] - p.t0) <= 1e-6) {
      last[3] = p.t1;
    } else {
      out.push([p.phase, cause, p.t0, p.t1]);
    }
  }
  return out;
}

/** The latest requests, a row each from arrival to end (earliest on top), coloured by phase
 * (a wait by its cause); hovering a bar shows its request's breakdown. */
export function waterfall(report) {
  const t0 = origin(report);
  const timelines = [...report.recent].sort((a, b) => a.arrival - b.arrival);
  const groups = new Map(); // one trace per colour, so that each shows once in the legend
  for (const t of timelines) {
    const hover = breakdown(report, t);
    for (const [phase, cause, start, end] of runs(t.phases)) {
      const key = JSON.stringify([phase, cause]);
      if (!groups.has(key)) groups.set(key, { phase, cause, rows: [] });
      groups.get(key).rows.push([t.req, start - t0, end - start, hover]);
    }
  }
  const bars = [...groups.values()].map(({ phase, cause, rows }) => ({
    type: "bar",
    orientation: "h",
    y: rows.map((r) => r[0]),
    base: rows.map((r) => r[1]),
    x: rows.map((r) => r[2]),
    customdata: rows.map((r) => r[2]), // %{x} would be the bar's end
    hovertext: rows.map((r) => r[3]),
    name: phase === "waiting" && cause ? label(report, cause) : phase,
    marker: { color: phaseColour(phase, cause) },
    hovertemplate: "%{fullData.name}: %{customdata:.3f} s<br>%{hovertext}<extra></extra>",
  }));
  const rows = timelines.map((t) => t.req);
  return figure(bars, `Latest ${rows.length} requests by phase`, "request", secondsAfter(t0), {}, {
    barmode: "overlay",
    height: Math.max(BARS_HEIGHT, 160 + ROW_PX * rows.length),
    yaxis: { categoryorder: "array", categoryarray: rows, autorange: "reversed" },
  });
}
