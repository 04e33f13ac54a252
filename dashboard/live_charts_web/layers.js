// MoE layers by their real index (a model whose first layers are dense, as DeepSeek's, has
// no expert row for them), and the group-skew panel of group-limited routing (DeepSeek).

import { figure, sideBySide } from "./figure.js";

/** The real layer index of each of `rows` expert rows: the latest frame's
 * `experts.moe_layers`, or 0..rows-1 for records from before it was sent. */
export function layerNames(v, rows) {
  const named = v.latest ? v.latest.experts.moe_layers : null;
  return named && named.length === rows ? named : Array.from({ length: rows }, (_, i) => i);
}

/** Tokens that chose each expert group per MoE layer over the last steps, and each layer's
 * group skew (max / mean group load, 1 = even) over steps; a title that says so when the
 * frames have no group counts (routing without groups). `time` is the steps' {marks, span}. */
export function groups(v, time) {
  const sum = v.groupSum || [];
  if (!sum.length) {
    return figure([], "Expert group skew: no group-limited routing in these frames");
  }
  const names = layerNames(v, sum.length);
  const heat = {
    type: "heatmap",
    y: names,
    z: sum,
    colorscale: "Viridis",
    showscale: false,
    hovertemplate: "layer %{y} group %{x}: %{z} tokens<extra></extra>",
  };
  const layers = v.groupSkew.length ? v.groupSkew[0].length : 0;
  const skew = Array.from({ length: layers }, (_, i) => ({
    x: v.steps,
    y: v.groupSkew.map((row) => row[i]),
    name: `layer ${names[i]}`,
    mode: "lines",
  }));
  return sideBySide(
    [heat],
    skew,
    "Expert group skew",
    [`tokens per group, last ${v.groupSteps} steps`, "max / mean group load"],
    ["group", "step"],
    ["layer", "max / mean"],
    time,
    { xaxis: { dtick: 1 }, yaxis: { type: "category" } },
  );
}
