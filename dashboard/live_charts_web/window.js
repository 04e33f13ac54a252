// The last steps of a telemetry stream (live, replayed or recorded) as chart-ready columns,
// computed as each frame arrives (rolling statistics, request colours and knob markers), so
// that a redraw only slices what is already there.

import { RollingPercentiles, RollingRate, RollingSum } from "./stats.js";

export const STAGES = ["schedule", "prepare", "forward", "sample", "moe"];
const QUEUES = ["waiting", "running", "swapped", "preempted"];
const LATENCY_WINDOW = 64; // finished requests
const RATE_WINDOW = 20; // steps
const EXPERT_WINDOW = 100; // steps
export const COLOURS = 10;
const MAX_REQUESTS = 4096; // colour assignments kept for requests seen lately

const sum = (xs) => xs.reduce((a, b) => a + b, 0);

/** Python's str() of a knob value, so that labels read as the server's own. */
function pyStr(value) {
  if (value === null) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  return String(value);
}

/** `v5: max_num_seqs 16→32`; the autopilot's changes say so (`v5 autopilot: ...`). */
export function markerLabel(change) {
  const who = change.origin === "autopilot" ? " autopilot" : "";
  return `v${change.version}${who}: ${knobLabel(change.changes)}`;
}

/** `{max_num_seqs: [8, 4]}` -> `max_num_seqs 8→4`. */
export function knobLabel(changes) {
  return Object.entries(changes)
    .map(([name, [old, now]]) => `${name} ${pyStr(old)}→${pyStr(now)}`)
    .join(", ");
}

/** [slot, request, KV blocks, context tokens] of each request in the frame's batch. */
export function blocks(frame) {
  const size = Math.max(frame.kv.block_size, 1);
  return frame.batch.slots.map((s) => [s.slot, s.req, Math.ceil(s.ctx / size), s.ctx]);
}

/** max/mean expert load per layer (NaN for a layer that routed nothing). */
export function layerImbalance(counts) {
  return counts.map((loads) => {
    const mean = sum(loads) / loads.length;
    return mean > 0 ? Math.max(...loads) / mean : NaN;
  });
}

/** Throws when `frame` lacks what a step needs, before anything is kept (a malformed message
 * is skipped and counted, never drawn). */
function check(frame) {
  const { batch, experts, a2a, latency } = frame;
  const lists = [batch.slots, experts.counts, experts.dropped, a2a.bytes];
  const latencies = [...latency.ttft_ms, ...latency.tpot_ms];
  if (
    !Number.isFinite(frame.step) ||
    !Number.isFinite(frame.t) ||
    !lists.every(Array.isArray) ||
    !experts.counts.every(Array.isArray) ||
    !latencies.every(Number.isFinite)
  ) {
    throw new Error(`not a step: ${JSON.stringify(frame).slice(0, 80)}`);
  }
}

/** The frame's numbers that do not depend on earlier steps, by column name. */
function stepRow(frame) {
  const { batch, kv, a2a } = frame;
  const tokens = batch.num_prefill_tokens + batch.num_decode_tokens;
  const sizes = blocks(frame).map((b) => b[2]);
  const row = {
    step: frame.step,
    max_slots: batch.max_slots,
    occupancy: batch.slots.length / Math.max(batch.max_slots, 1),
    budget: tokens / Math.max(batch.token_budget, 1),
    "kv.watermark": kv.usable - (kv.watermark_blocks ?? 0),
    dropped: sum(frame.experts.dropped),
    "a2a.total": sum(a2a.bytes.map(sum)),
    "a2a.gather": sum((a2a.gather_bytes || []).map(sum)),
    "a2a.measured": a2a.mode === "measured" ? 1 : 0,
    "rank.imbalance": a2a.rank_tokens && a2a.rank_tokens.length ? (a2a.imbalance ?? NaN) : NaN,
    "blocks.mean": sizes.length ? sum(sizes) / sizes.length : NaN,
    "blocks.max": sizes.length ? Math.max(...sizes) : NaN,
  };
  for (const k of ["used", "cached", "free", "usable"]) row[`kv.${k}`] = kv[k];
  row["kv.window_used"] = kv.window_total ? kv.window_used : NaN; // sliding layers' own pool
  for (const s of STAGES) row[`dur.${s}`] = frame.dur_ms[s];
  for (const q of QUEUES) row[`queue.${q}`] = Number(frame.queue[q]);
  return row;
}

/** Per-step rows of per-layer values, each as wide as the widest (NaN where a step had fewer
 * layers). */
function padded(rows) {
  const width = Math.max(0, ...rows.map((r) => r.length));
  return rows.map((r) => Array.from({ length: width }, (_, i) => r[i] ?? NaN));
}

/** A snapshot of the last n steps, oldest first. */
export class WindowView {
  constructor(rows, imbalance, slots, markers, expertSum, expertSteps, latest, groups) {
    this.rows = rows;
    this.imbalance = imbalance; // [n][layers], NaN where a step had fewer layers
    this.slots = slots; // per step: {slots, colours, texts, prefill}
    this.markers = markers; // [step, label, reason] of knob changes (reason null: none given)
    this.expertSum = expertSum; // counts summed over the last `expertSteps` steps
    this.expertSteps = expertSteps;
    this.latest = latest;
    // group-limited routing (DeepSeek): max/mean group load [n][layers], NaN where a step had
    // none; tokens per group [layers][groups] summed over the last `groupSteps` steps
    this.groupSkew = groups.skew;
    this.groupSum = groups.sum;
    this.groupSteps = groups.steps;
    this.steps = this.col("step");
  }

  col(name) {
    return this.rows.map((row) => row[name]);
  }

  get length() {
    return this.rows.length;
  }
}

/** The last `maxlen` steps; `add` a frame as it arrives, `view` at redraw time. */
export class StepWindow {
  constructor(maxlen = 600) {
    this.maxlen = maxlen;
    this.clear();
  }

  clear() {
    this.rows = [];
    this.imbalance = [];
    this.slots = [];
    this.markers = [];
    this.ttft = new RollingPercentiles(LATENCY_WINDOW);
    this.tpot = new RollingPercentiles(LATENCY_WINDOW);
    this.rate = new RollingRate(RATE_WINDOW, 2);
    this.experts = new RollingSum(EXPERT_WINDOW);
    this.groupSkew = [];
    this.groups = new RollingSum(EXPERT_WINDOW);
    this.colours = new Map();
    this.nextColour = 0;
    this.latest = null;
  }

  /** One step, as it arrives; a frame of another session (a restarted server) starts the
   * window over. A frame that is not a step throws before anything is kept. */
  add(frame) {
    check(frame);
    const row = stepRow(frame);
    if (this.latest !== null && frame.session !== this.latest.session) this.clear();
    const { batch, latency } = frame;
    const decode = batch.num_decode_tokens;
    [row["ttft.p50"], row["ttft.p99"]] = this.ttft.add(latency.ttft_ms);
    [row["tpot.p50"], row["tpot.p99"]] = this.tpot.add(latency.tpot_ms);
    [row.tok_s, row.decode_tok_s] = this.rate.add(frame.t, [
      batch.num_prefill_tokens + decode,
      decode,
    ]);
    this.experts.add(frame.experts.counts);
    this.push(this.rows, row);
    this.push(this.imbalance, layerImbalance(frame.experts.counts));
    const groups = frame.experts.groups || [];
    this.groups.add(groups);
    this.push(this.groupSkew, layerImbalance(groups));
    this.push(this.slots, this.slotColumn(batch.slots));
    for (const change of frame.knob_changes || []) {
      this.markers.push([frame.step, markerLabel(change), change.reason || null]);
    }
    while (this.markers.length && this.markers[0][0] < this.rows[0].step) this.markers.shift();
    this.latest = frame;
  }

  push(list, item) {
    list.push(item);
    if (list.length > this.maxlen) list.shift();
  }

  /** A colour per request, in order of first sight, kept while it is seen lately. */
  colour(req) {
    let colour = this.colours.get(req);
    if (colour === undefined) {
      colour = this.nextColour;
      this.nextColour = (this.nextColour + 1) % COLOURS;
    }
    this.colours.delete(req);
    this.colours.set(req, colour);
    if (this.colours.size > MAX_REQUESTS) this.colours.delete(this.colours.keys().next().value);
    return colour;
  }

  slotColumn(slots) {
    return {
      slots: slots.map((s) => s.slot),
      colours: slots.map((s) => this.colour(s.req)),
      texts: slots.map((s) => `${s.req} ${s.phase} ${s.tokens} tok, ctx ${s.ctx}`),
      prefill: slots.filter((s) => s.phase === "prefill").map((s) => s.slot),
    };
  }

  /** The last `last` steps (all when undefined). */
  view(last) {
    const n = last === undefined ? this.rows.length : Math.min(last, this.rows.length);
    const start = this.rows.length - n;
    const first = n ? this.rows[start].step : Infinity;
    return new WindowView(
      this.rows.slice(start),
      padded(this.imbalance.slice(start)),
      this.slots.slice(start),
      this.markers.filter((m) => m[0] >= first),
      this.experts.total,
      this.experts.count,
      this.latest,
      {
        skew: padded(this.groupSkew.slice(start)),
        sum: this.groups.total,
        steps: this.groups.count,
      },
    );
  }
}
