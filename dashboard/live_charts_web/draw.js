// The panels on the page: one div each, laid out in ROWS (or the panels named, one a row),
// redrawn with Plotly.react from a window view. Only panels on screen are redrawn, one at a
// time, the most overdue first.

import { PANELS, ROWS } from "./panels.js";

const CONFIG = { displaylogo: false, responsive: true };

/** `figure` ({data, layout}) drawn into `div` with Plotly.react; the div counts its draws
 * (the tests and the benchmark read them). */
export function react(div, { data, layout }) {
  window.Plotly.react(div, data, layout, CONFIG);
  div.dataset.draws = String(Number(div.dataset.draws) + 1);
}

export class Charts {
  /** Every panel in ROWS, or just those `names`, one a row, in `root` (emptied first). */
  constructor(root, names = null) {
    this.divs = {};
    this.visible = new Set();
    this.stale = new Set(); // not drawn since the data changed
    this.drawnAt = {}; // panel -> when it was last drawn (performance.now())
    const observer = new IntersectionObserver((entries) => {
      for (const entry of entries) {
        const name = entry.target.dataset.panel;
        if (entry.isIntersecting) this.visible.add(name);
        else this.visible.delete(name);
      }
    });
    root.replaceChildren();
    for (const row of names ? names.map((name) => [name]) : ROWS) {
      const line = document.createElement("div");
      line.className = `row cols-${row.length}`;
      for (const name of row) {
        const div = document.createElement("div");
        div.className = "panel";
        div.dataset.panel = name;
        div.dataset.draws = "0";
        line.append(div);
        this.divs[name] = div;
        this.drawnAt[name] = -Infinity;
        this.stale.add(name);
        observer.observe(div);
      }
      root.append(line);
    }
  }

  /** Marks every panel as out of date (a new view was made). */
  invalidate() {
    for (const name of Object.keys(this.divs)) this.stale.add(name);
  }

  /** Redraws from `view` the out-of-date panel on screen that was drawn longest ago; whether
   * one was drawn. The caller paces the views, so each is drawn once per view: a time gate
   * per panel as well kept a panel drawn early in one view out of the next, and the slowest
   * panel fell to 4.5 redraws a second. A panel's div counts its draws and keeps the last
   * one's milliseconds (the tests and the benchmark read them). */
  drawNext(view) {
    let next = null;
    for (const name of this.visible) {
      if (this.stale.has(name)) {
        if (next === null || this.drawnAt[name] < this.drawnAt[next]) next = name;
      }
    }
    if (next === null) return false;
    const t0 = performance.now();
    const div = this.divs[next];
    react(div, PANELS[next](view));
    this.stale.delete(next);
    this.drawnAt[next] = t0;
    div.dataset.ms = (performance.now() - t0).toFixed(1);
    return true;
  }
}
