// The controls above the charts: how many steps to show, and on a replay the player's
// pause / resume / seek / speed, sent to the server as websocket ops (api/replay_ws.py).

function button(label, onClick) {
  const b = document.createElement("button");
  b.textContent = label;
  b.onclick = onClick;
  return b;
}

function labelled(text, input) {
  const label = document.createElement("label");
  label.append(`${text} `, input);
  return label;
}

/** A number input for the steps shown (50 to `max`); `onChange(n)` on each change. */
function stepsShown(initial, max, onChange) {
  const input = document.createElement("input");
  Object.assign(input, { type: "number", min: 50, max, step: 50, value: initial });
  input.setAttribute("aria-label", "steps shown");
  input.onchange = () => onChange(Math.max(1, Math.min(max, Number(input.value) || initial)));
  return labelled("steps shown", input);
}

/** Pause, resume, seek to a step and speed, each one op on the replay socket; `onSeek`
 * runs before a seek is sent (the window empties). */
function replayControls(send, onSeek, speeds, speed) {
  const step = document.createElement("input");
  Object.assign(step, { type: "number", min: 0, value: 0 });
  step.setAttribute("aria-label", "seek to step");
  const choice = document.createElement("select");
  choice.setAttribute("aria-label", "speed");
  for (const s of speeds) {
    choice.append(new Option(s ? `${s}x` : "as fast as possible", String(s), false, s === speed));
  }
  choice.onchange = () => send({ op: "speed", speed: Number(choice.value) });
  return [
    button("Pause", () => send({ op: "pause" })),
    button("Resume", () => send({ op: "resume" })),
    labelled("seek to step", step),
    button("Seek", () => {
      onSeek();
      send({ op: "seek", step: Math.max(0, Math.floor(Number(step.value) || 0)) });
    }),
    labelled("speed", choice),
  ];
}

/** Fills `root` with the controls for `args` (the component's arguments). */
export function showControls(root, args, { onShown, send, onSeek }) {
  const parts = [stepsShown(args.shown, args.max_steps, onShown)];
  if (args.replay) parts.push(...replayControls(send, onSeek, args.speeds, args.speed));
  root.replaceChildren(...parts);
}
