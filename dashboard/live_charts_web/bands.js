// The what-if preview's bands: each metric's median and 80% band over the twin's simulations,
// for the knobs now and with the change, as a share of the median now (so that metrics of
// different units share one axis); the hover gives the values themselves.

const NOW = "#1f77b4";
const THEN = "#ff7f0e";

/** One trace of a side ("now" or "then") of `rows` (whatif_view.band_rows): a point at each
 * metric's median over the median now, its error bar from the band's low to its high. */
function side(rows, key, name, color) {
  const shown = rows.filter((r) => r.now[0] && r[key][0] !== null);
  const scale = (r, v) => (v === null ? null : v / r.now[0]);
  return {
    type: "scatter",
    mode: "markers",
    name,
    x: shown.map((r) => r.label),
    y: shown.map((r) => scale(r, r[key][0])),
    error_y: {
      type: "data",
      symmetric: false,
      array: shown.map((r) => scale(r, r[key][2] ?? r[key][0]) - scale(r, r[key][0])),
      arrayminus: shown.map((r) => scale(r, r[key][0]) - scale(r, r[key][1] ?? r[key][0])),
      color,
    },
    marker: { color, size: 9 },
    text: shown.map((r) => `${r[key][0]} [${r[key][1]} – ${r[key][2]}]`),
    hovertemplate: "%{x}: %{text}<extra>" + name + "</extra>",
  };
}

/** The preview's figure: both sides of every metric with a median now. */
export function bandFigure(rows) {
  return {
    data: [side(rows, "now", "now", NOW), side(rows, "then", "with the change", THEN)],
    layout: {
      title: { text: "median and 80% band of the twin's simulations" },
      yaxis: { title: { text: "× the median now" }, rangemode: "tozero" },
      height: 320,
      margin: { t: 40, r: 10, b: 60, l: 50 },
      legend: { orientation: "h" },
      scattermode: "group",
    },
  };
}

/** Draw the preview's bands into `div` (plotly.js loaded). */
export function drawBands(div, rows) {
  const { data, layout } = bandFigure(rows);
  window.Plotly.react(div, data, layout, { displayModeBar: false, responsive: true });
}
