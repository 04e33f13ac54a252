// Rolling statistics updated one step at a time, each update O(window), not O(steps): a
// JavaScript port of stats.ranked_percentile, with the same arithmetic in the same order, so
// that the browser shows the very numbers the rest of moescope reports
// (tests/dashboard/test_js_window.py).

/** stats.ranked_percentile: the q-th percentile of values sorted ascending (at least one),
 * by linear interpolation between the closest ranks (numpy's default). */
export function rankedPercentile(ranked, q) {
  const pos = (ranked.length - 1) * (q / 100);
  const lo = Math.floor(pos);
  const a = ranked[lo];
  const b = ranked[Math.min(lo + 1, ranked.length - 1)];
  const t = pos - lo;
  // interpolated from the nearer neighbour, as numpy does, so that the results agree exactly
  return t < 0.5 ? a + (b - a) * t : b - (b - a) * (1 - t);
}

/** The index of the first element of sorted `xs` above `x` (Python's bisect_right). */
function bisectRight(xs, x) {
  let lo = 0;
  let hi = xs.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (x < xs[mid]) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/** The index of the first element of sorted `xs` not below `x` (Python's bisect_left). */
function bisectLeft(xs, x) {
  let lo = 0;
  let hi = xs.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** p50 and p99 of the last `window` values, kept sorted as values come and go. */
export class RollingPercentiles {
  constructor(window) {
    this.window = window;
    this.values = [];
    this.ranked = [];
  }

  /** Takes this step's values; returns [p50, p99] after it ([NaN, NaN] before any value). */
  add(values) {
    for (const v of values) {
      this.values.push(v);
      this.ranked.splice(bisectRight(this.ranked, v), 0, v);
      if (this.values.length > this.window) {
        this.ranked.splice(bisectLeft(this.ranked, this.values.shift()), 1);
      }
    }
    if (!this.ranked.length) return [NaN, NaN];
    return [rankedPercentile(this.ranked, 50), rankedPercentile(this.ranked, 99)];
  }
}

/** Per-second rates of some counts over the last `window` steps (by their end times). */
export class RollingRate {
  constructor(window, width) {
    this.window = window;
    this.entries = [];
    this.total = new Array(width).fill(0);
  }

  /** This step's time and counts; the counts of the steps after the window's first, divided
   * by the time since it (NaN while that span is 0). */
  add(t, counts) {
    this.entries.push([t, counts]);
    this.total = this.total.map((x, i) => x + counts[i]);
    if (this.entries.length > this.window + 1) {
      const old = this.entries.shift()[1];
      this.total = this.total.map((x, i) => x - old[i]);
    }
    const [t0, first] = this.entries[0];
    const span = t - t0;
    if (span <= 0) return counts.map(() => NaN);
    return this.total.map((x, i) => (x - first[i]) / span);
  }
}

/** The element-wise sum of the last `window` matrices (restarted when their shape changes). */
export class RollingSum {
  constructor(window) {
    this.window = window;
    this.matrices = [];
    this.total = null;
  }

  add(matrix) {
    if (this.total === null || !sameShape(this.total, matrix)) {
      this.matrices = [];
      this.total = matrix.map((row) => row.map(() => 0));
    }
    this.matrices.push(matrix);
    this.total = this.total.map((row, i) => row.map((x, j) => x + matrix[i][j]));
    if (this.matrices.length > this.window) {
      const old = this.matrices.shift();
      this.total = this.total.map((row, i) => row.map((x, j) => x - old[i][j]));
    }
  }

  get count() {
    return this.matrices.length;
  }
}

function sameShape(a, b) {
  return a.length === b.length && a.every((row, i) => row.length === b[i].length);
}
