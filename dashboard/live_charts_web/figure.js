// Panel layouts: one panel's traces over a shared step axis, two plots side by side, a
// right-hand axis, knob-change markers as dashed labelled lines.

export const HEIGHT = 300;
const MARKER = "#d62728";
const AUTOPILOT_MARKER = "#9467bd"; // the autopilot's changes, apart from a person's
const HOVER_WIDTH = 80; // characters a line of a marker's hover holds (a longer word overflows)

/** The autopilot's markers in their own colour (their label names it: window.js). */
export function markerColour(label) {
  return label.split(":", 1)[0].endsWith(" autopilot") ? AUTOPILOT_MARKER : MARKER;
}

/** A knob change's reason as a marker's hover text: its words in lines of at most HOVER_WIDTH
 * characters joined by <br> ("" without a reason), its "&" and "<" escaped: plotly reads a
 * hover's tags. Lengths count code points, as Python's. */
export function hoverText(reason) {
  const lines = [];
  const size = (s) => [...s].length;
  for (const word of (reason || "").split(/[ \t\n\r\f\v]+/)) {
    if (!word) continue;
    if (lines.length && size(lines[lines.length - 1]) + 1 + size(word) <= HOVER_WIDTH) {
      lines[lines.length - 1] += " " + word;
    } else {
      lines.push(word);
    }
  }
  return lines.map((line) => line.replaceAll("&", "&amp;").replaceAll("<", "&lt;")).join("<br>");
}

function axis(title, extra = {}) {
  return { title: { text: title }, ...extra };
}

/** Dashed vertical lines, each labelled, at the steps of knob changes (on x/y`suffix`); a
 * change's reason shows when the label is hovered. */
export function markers(marks, suffix = "") {
  const xref = `x${suffix}`;
  const yref = `y${suffix} domain`;
  const shapes = marks.map(([x, text]) => ({
    type: "line",
    xref,
    yref,
    x0: x,
    x1: x,
    y0: 0,
    y1: 1,
    line: { dash: "dash", color: markerColour(text), width: 1 },
  }));
  const notes = marks.map(([x, text, reason]) => {
    const hover = hoverText(reason);
    return {
      xref,
      yref,
      x,
      y: 1,
      text,
      showarrow: false,
      xanchor: "right",
      yanchor: "top",
      font: { size: 10, color: markerColour(text) },
      bgcolor: "rgba(255, 255, 255, 0.8)",
      ...(hover ? { hovertext: hover } : {}),
    };
  });
  return [shapes, notes];
}

/** `base` with `extra`'s keys; object values (axes) are merged one level down. */
function merged(base, extra) {
  const out = { ...base };
  for (const [key, value] of Object.entries(extra)) {
    const old = out[key];
    const isObject = (x) => x && typeof x === "object" && !Array.isArray(x);
    out[key] = isObject(old) && isObject(value) ? { ...old, ...value } : value;
  }
  return out;
}

/** A fixed x range, so that marker labels do not widen the axis (autorange fits them). */
function range(span) {
  return span ? { range: span } : {};
}

/** One panel: `data` over a shared x axis; `time` = {marks, span} for a time series;
 * `extra` layout keys. Returns {data, layout} for Plotly.react. */
export function figure(data, title, yTitle = "", xTitle = "step", time = {}, extra = {}) {
  const [shapes, notes] = markers(time.marks || []);
  const base = {
    title: { text: title },
    height: HEIGHT,
    margin: { l: 50, r: 20, t: 40, b: 40 },
    legend: { orientation: "h", y: -0.25 },
    xaxis: axis(xTitle, range(time.span)),
    yaxis: axis(yTitle),
    shapes,
    annotations: notes,
  };
  return { data, layout: merged(base, extra) };
}

/** The layout of a right-hand y axis (`yaxis2`) over the main plot; traces set yaxis "y2". */
export function secondaryY(title, extra = {}) {
  return axis(title, { overlaying: "y", side: "right", ...extra });
}

/** Two plots in one panel (left: x/y; right: x2/y2, where the markers, span and legend go). */
export function sideBySide(left, right, title, titles, xTitles, yTitles, time = {}, extra = {}) {
  const [shapes, notes] = markers(time.marks || [], "2");
  const subtitles = [0.2, 0.775].map((x, i) => ({
    xref: "paper",
    yref: "paper",
    x,
    y: 1.0,
    text: titles[i],
    showarrow: false,
    xanchor: "center",
    yanchor: "bottom",
  }));
  const panel = {
    xaxis: axis(xTitles[0], { domain: [0, 0.4] }),
    yaxis: axis(yTitles[0]),
    xaxis2: axis(xTitles[1], { domain: [0.55, 1], anchor: "y2", ...range(time.span) }),
    yaxis2: axis(yTitles[1], { anchor: "x2" }),
    legend: { x: 0.55 },
    shapes,
    annotations: [...subtitles, ...notes],
  };
  const moved = right.map((trace) => ({ ...trace, xaxis: "x2", yaxis: "y2" }));
  return figure([...left, ...moved], title, "", "step", {}, merged(panel, extra));
}
