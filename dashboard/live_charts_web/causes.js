// One fixed colour per latency cause (tuning/attribution/causes.py's CAUSES), so that a cause looks
// the same in every attribution chart: queueing in warm colours, prefill in greens, decode in
// blues, the rest apart.

export const CAUSE_COLOURS = {
  queue_slots: "#d62728",
  queue_budget: "#ff7f0e",
  queue_kv: "#e377c2",
  queue_priority: "#bcbd22",
  queue_swapped: "#c5b0d5",
  queue_static: "#f7b6d2",
  queue_busy: "#ffbb78",
  prefill: "#2ca02c",
  interference: "#98df8a",
  preemption: "#9467bd",
  overhead: "#7f7f7f",
  decode: "#1f77b4",
  decode_tax: "#aec7e8",
  straggler: "#17becf",
};
export const UNKNOWN = "#c7c7c7"; // a cause added on the server after this mapping
const PHASE_CAUSE = { prefill: "prefill", decode: "decode", preempted: "preemption" };

export function colour(cause) {
  return CAUSE_COLOURS[cause] || UNKNOWN;
}

/** A waterfall bar's colour: a wait takes its cause's, the other phases their own. */
export function phaseColour(phase, cause) {
  return colour(phase === "waiting" ? cause : PHASE_CAUSE[phase]);
}

/** `causes` in CAUSE_COLOURS' order (a stable stacking order), unknown ones last by name. */
export function ordered(causes) {
  const known = Object.keys(CAUSE_COLOURS).filter((c) => causes.has(c));
  const unknown = [...causes].filter((c) => !(c in CAUSE_COLOURS)).sort();
  return [...known, ...unknown];
}
