// The panels of the Live, Replay and Compare pages, each a function from a WindowView
// (window.js) to {data, layout}, drawn in the browser.

import { figure, secondaryY, sideBySide } from "./figure.js";
import { groups, layerNames } from "./layers.js";
import { blocks, STAGES } from "./window.js";

const LINES = { mode: "lines" };

/** A time series' knob markers and x span (half a step either side of the window). */
function time(v) {
  const s = v.steps;
  return { marks: v.markers, span: s.length ? [s[0] - 0.5, s[s.length - 1] + 0.5] : null };
}

/** One line a column; `names` maps column to legend name. */
function lines(v, names, extra = {}) {
  return Object.entries(names).map(([col, name]) => ({
    x: v.steps,
    y: v.col(col),
    name,
    ...LINES,
    ...extra,
  }));
}

/** Slots x steps coloured by request; prefill cells are marked with an outlined square. */
function batch(v) {
  const rows = Math.max(
    0,
    ...v.col("max_slots"),
    ...v.slots.map((c) => Math.max(-1, ...c.slots) + 1),
  );
  const z = Array.from({ length: rows }, () => new Array(v.length).fill(null));
  const text = Array.from({ length: rows }, () => new Array(v.length).fill(""));
  const px = [];
  const py = [];
  v.slots.forEach((column, i) => {
    column.slots.forEach((slot, j) => {
      z[slot][i] = column.colours[j];
      text[slot][i] = column.texts[j];
    });
    for (const slot of column.prefill) {
      px.push(v.steps[i]);
      py.push(slot);
    }
  });
  const heat = {
    type: "heatmap",
    x: v.steps,
    y: Array.from({ length: rows }, (_, i) => i),
    z,
    text,
    hovertemplate: "step %{x} slot %{y}<br>%{text}<extra></extra>",
    colorscale: "Turbo",
    zmin: 0,
    zmax: 9,
    showscale: false,
    name: "decode",
  };
  const prefill = {
    x: px,
    y: py,
    mode: "markers",
    name: "prefill",
    hoverinfo: "skip",
    marker: { symbol: "square-open", color: "black", size: 7 },
  };
  return figure([heat, prefill], "Batch slots (colour = request)", "slot", "step", time(v));
}

/** Slot occupancy and token-budget use, as fractions, over steps. */
function usage(v) {
  return figure(
    lines(v, { occupancy: "slot occupancy", budget: "token budget use" }),
    "Batch occupancy",
    "fraction",
    "step",
    time(v),
    { yaxis: { range: [0, 1.05], tickformat: ".0%" } },
  );
}

/** Used / prefix-cached / free blocks stacked, with usable capacity and watermark lines. */
function kv(v) {
  const stacked = [
    ["used", "#1f77b4"],
    ["cached", "#2ca02c"],
    ["free", "#d9d9d9"],
  ].map(([key, colour]) => ({
    x: v.steps,
    y: v.col(`kv.${key}`),
    name: key,
    stackgroup: "kv",
    line: { color: colour },
    ...LINES,
  }));
  const limits = [
    ["kv.usable", "usable", { color: "black", dash: "dot" }],
    ["kv.watermark", "watermark", { color: "#ff7f0e", dash: "dash" }],
  ].map(([col, name, line]) => ({ x: v.steps, y: v.col(col), name, line, ...LINES }));
  // what a token costs in one layer's cache (MLA's latent, or K and V), where the frame says
  const latestKV = v.latest ? v.latest.kv : {};
  const perLayer = latestKV.bytes_per_token_layer || 0;
  const cost = perLayer ? ` (${perLayer.toLocaleString("en")} B per token per layer)` : "";
  // gpt-oss: the sliding layers' own pool, and the blocks it gave back behind the window
  const windowed = latestKV.window_total
    ? [{ x: v.steps, y: v.col("kv.window_used"), name: "window pool used", ...LINES }]
    : [];
  const saved = latestKV.window_total
    ? `; ${latestKV.behind_window} saved by the window (pool ${latestKV.window_used}/${latestKV.window_total})`
    : "";
  const title = `KV cache blocks${cost}${saved}`;
  return figure([...stacked, ...limits, ...windowed], title, "blocks", "step", time(v));
}

/** KV blocks per running request: each of the latest step's, and mean / max over steps. */
function kvBlocks(v) {
  const latest = v.latest ? blocks(v.latest) : [];
  const bars = {
    type: "bar",
    x: latest.map(([slot]) => `slot ${slot}`),
    y: latest.map((b) => b[2]),
    name: "blocks",
    customdata: latest.map(([, req, , ctx]) => [req, ctx]),
    marker: { color: "#1f77b4" },
    hovertemplate: "%{customdata[0]}: %{y} blocks, %{customdata[1]} tokens<extra></extra>",
    showlegend: false,
  };
  const overTime = [
    ...lines(v, { "blocks.max": "max" }, { line: { dash: "dot" } }),
    ...lines(v, { "blocks.mean": "mean per request" }),
  ];
  return sideBySide(
    [bars],
    overTime,
    "KV blocks per running request",
    ["latest step", "over steps"],
    ["batch slot", "step"],
    ["blocks", "blocks"],
    time(v),
  );
}

/** Layer x expert token counts: the latest step and the sum over the last steps; rows are
 * the MoE layers, named by their real index. */
function experts(v) {
  const heat = (z) => ({
    type: "heatmap",
    y: layerNames(v, z.length),
    z,
    colorscale: "Viridis",
    showscale: false,
    hovertemplate: "layer %{y} expert %{x}: %{z}<extra></extra>",
  });
  const dtick = { dtick: 1 };
  return sideBySide(
    v.latest ? [heat(v.latest.experts.counts)] : [],
    v.expertSum ? [heat(v.expertSum)] : [],
    "Expert token counts",
    ["latest step", `last ${v.expertSteps} steps`],
    ["expert", "expert"],
    ["layer", ""],
    {},
    { xaxis: dtick, yaxis: { type: "category" }, xaxis2: dtick, yaxis2: { type: "category" } },
  );
}

/** Per-layer max/mean expert load over steps (1 = perfectly balanced), and dropped tokens. */
function imbalance(v) {
  const layers = v.imbalance.length ? v.imbalance[0].length : 0;
  const names = layerNames(v, layers);
  const data = Array.from({ length: layers }, (_, layer) => ({
    x: v.steps,
    y: v.imbalance.map((row) => row[layer]),
    name: `layer ${names[layer]}`,
    ...LINES,
  }));
  const dropped = v.col("dropped");
  if (!dropped.some((x) => x)) {
    return figure(data, "Expert imbalance", "max / mean", "step", time(v));
  }
  data.push({
    type: "bar",
    x: v.steps,
    y: dropped,
    name: "dropped tokens",
    opacity: 0.4,
    yaxis: "y2",
  });
  return figure(data, "Expert imbalance", "max / mean", "step", time(v), {
    yaxis2: secondaryY("dropped tokens", { rangemode: "tozero" }),
  });
}

/** Source x destination rank bytes of the latest step, titled measured or modeled. */
function a2a(v) {
  if (!v.latest) return figure([], "All-to-all bytes", "", "destination rank");
  const a = v.latest.a2a;
  const heat = {
    type: "heatmap",
    z: a.bytes,
    colorscale: "Blues",
    hovertemplate: "src %{y} → dst %{x}: %{z} B<extra></extra>",
  };
  return figure(
    [heat],
    `All-to-all bytes (${a.mode}, ep_size ${a.ep_size})`,
    "source rank",
    "destination rank",
    {},
    { xaxis: { dtick: 1 }, yaxis: { dtick: 1 } },
  );
}

/** Total all-to-all bytes per step, one line per mode (measured or modeled), and the
 * all-gather of MoE outputs dotted beside them. */
function a2aVolume(v) {
  const measured = v.col("a2a.measured").map((m) => m > 0);
  const kinds = [
    ["measured", measured],
    ["modeled", measured.map((m) => !m)],
  ].filter(([, kind]) => kind.some((x) => x));
  const only = (values, kind) => values.map((x, i) => (kind[i] ? x : NaN));
  const total = v.col("a2a.total");
  const gather = v.col("a2a.gather");
  const data = kinds.map(([mode, kind]) => ({
    x: v.steps,
    y: only(total, kind),
    name: `${mode} bytes`,
    ...LINES,
  }));
  for (const [mode, kind] of kinds) {
    if (gather.some((x, i) => kind[i] && x)) {
      data.push({
        x: v.steps,
        y: only(gather, kind),
        name: `${mode} all-gather`,
        line: { dash: "dot" },
        ...LINES,
      });
    }
  }
  const modes = kinds.map(([mode]) => mode).join(" and ") || "none yet";
  return figure(data, `All-to-all volume per step (${modes})`, "bytes", "step", time(v));
}

/** Token-expert pairs per expert-parallel rank in the latest step, and max/mean over steps. */
function ranks(v) {
  const a = v.latest ? v.latest.a2a : {};
  const tokens = a.rank_tokens || [];
  const moeMs = a.rank_moe_ms || [];
  const bars = {
    type: "bar",
    x: tokens.map((_, r) => `rank ${r}`),
    y: tokens,
    name: "pairs",
    hovertext: moeMs.length === tokens.length ? moeMs.map((ms) => `${ms.toFixed(3)} ms MoE`) : null,
    marker: { color: "#9467bd" },
    showlegend: false,
  };
  let title = "Expert-parallel rank load";
  if ("placement_version" in a) title += ` (placement v${a.placement_version})`;
  if (!tokens.length) title += ": no per-rank loads in these frames";
  return sideBySide(
    [bars],
    lines(v, { "rank.imbalance": "max / mean" }, { showlegend: false }),
    title,
    ["latest step", "imbalance over steps"],
    ["rank", "step"],
    ["token-expert pairs", "max / mean"],
    time(v),
  );
}

/** TTFT and TPOT p50/p99 over the last finished requests. */
function latency(v) {
  const ttft = lines(v, { "ttft.p50": "TTFT p50", "ttft.p99": "TTFT p99" }, { connectgaps: true });
  const tpot = lines(
    v,
    { "tpot.p50": "TPOT p50", "tpot.p99": "TPOT p99" },
    { connectgaps: true, yaxis: "y2" },
  );
  return figure([...ttft, ...tpot], "Latency (rolling)", "TTFT ms", "step", time(v), {
    yaxis2: secondaryY("TPOT ms"),
  });
}

/** Processed and decoded tokens per second over the last steps. */
function throughput(v) {
  return figure(
    lines(v, { tok_s: "all tokens/s", decode_tok_s: "decode tokens/s" }),
    "Throughput",
    "tokens/s",
    "step",
    time(v),
  );
}

/** Step time stacked by stage; the MoE part of forward as a separate line. */
function stepTime(v) {
  const stages = STAGES.filter((s) => s !== "moe").map((s) => ({
    x: v.steps,
    y: v.col(`dur.${s}`),
    name: s,
    stackgroup: "dur",
    ...LINES,
  }));
  const moe = {
    x: v.steps,
    y: v.col("dur.moe"),
    name: "moe (within forward)",
    line: { color: "black", dash: "dot" },
    ...LINES,
  };
  return figure([...stages, moe], "Step time", "ms", "step", time(v));
}

/** Waiting / running / swapped requests, and preemptions per step. */
function queues(v) {
  const data = lines(v, { "queue.waiting": "waiting", "queue.running": "running", "queue.swapped": "swapped" });
  const preempted = v.col("queue.preempted");
  data.push({
    type: "bar",
    x: v.steps,
    y: preempted,
    name: "preempted",
    marker: { color: "#d62728" },
    opacity: 0.6,
    yaxis: "y2",
  });
  const peak = Math.max(1, ...preempted); // whole preemptions on the right axis
  return figure(data, "Queues", "requests", "step", time(v), {
    yaxis: { rangemode: "tozero" },
    yaxis2: secondaryY("preemptions", { range: [0, peak * 1.05], dtick: Math.max(1, Math.ceil(peak / 4)) }),
  });
}

/** Every panel by name, and the page's rows of them (two a row, the wide ones alone). */
export const PANELS = {
  batch,
  usage,
  kv,
  queues,
  kv_blocks: kvBlocks,
  experts,
  imbalance,
  groups: (v) => groups(v, time(v)),
  a2a,
  a2a_volume: a2aVolume,
  ranks,
  latency,
  throughput,
  step_time: stepTime,
};

export const ROWS = [
  ["batch", "usage"],
  ["kv", "queues"],
  ["kv_blocks"],
  ["experts", "imbalance"],
  ["groups"],
  ["a2a", "a2a_volume"],
  ["ranks"],
  ["latency", "throughput"],
  ["step_time"],
];
