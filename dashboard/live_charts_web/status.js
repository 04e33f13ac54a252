// The line above the charts: the connection's state (and why, when it is not connected),
// the latest step and knob version, and how many steps were received, dropped by the server
// for this page, or skipped as malformed. On a replay, the player's state too.

function item(label, value) {
  const span = document.createElement("span");
  span.textContent = `${label} ${value}`;
  return span;
}

export function showStatus(root, state, detail, feed) {
  const latest = feed.window.latest;
  const badge = document.createElement("span");
  badge.className = `state ${state.split(" ").pop()}`;
  badge.textContent = state;
  const parts = [badge];
  if (feed.replay) {
    parts.push(item("replay", feed.replay.state), item("speed", `${feed.replay.speed}x`));
  }
  parts.push(
    item("step", latest ? latest.step : "–"),
    item("knobs version", latest ? latest.knobs_version : "–"),
    item("steps received", feed.received),
    item("dropped steps", feed.dropped),
    item("malformed skipped", feed.malformed),
  );
  const why = [detail, feed.error].filter((x) => x).join(" · ");
  if (why) {
    const line = document.createElement("span");
    line.className = "detail";
    line.textContent = why;
    parts.push(line);
  }
  root.replaceChildren(...parts);
}
