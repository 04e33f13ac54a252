// The Streamlit custom-component protocol (components v1), written out by hand: the iframe
// says it is ready, the page answers with "render" messages carrying the Python arguments,
// and the iframe tells the page how tall it is. No build step, no npm package.

function send(type, data) {
  window.parent.postMessage({ isStreamlitMessage: true, type, ...data }, "*");
}

/** Calls `callback(args)` on every render message; tells the page the component is ready. */
export function onRender(callback) {
  window.addEventListener("message", (event) => {
    if (event.data && event.data.type === "streamlit:render") {
      callback(event.data.args);
    }
  });
  send("streamlit:componentReady", { apiVersion: 1 });
}

/** Keeps the iframe as tall as the document inside it. */
export function followHeight() {
  let last = 0;
  new ResizeObserver(() => {
    const height = document.documentElement.scrollHeight;
    if (height !== last) {
      last = height;
      send("streamlit:setFrameHeight", { height });
    }
  }).observe(document.body);
}
