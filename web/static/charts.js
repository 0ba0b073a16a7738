// Charts, drawn by uPlot (vendored in /vendor). Latencies on a log scale: untuned and tuned differ by 100x.

import uPlot from '/vendor/uPlot.esm.js';

const COLORS = ['#2563eb', '#d97706', '#059669', '#7c3aed', '#db2777', '#0891b2', '#65a30d', '#dc2626'];
export const colorOf = (i) => COLORS[i % COLORS.length];

function sizeOf(el, height) {
  return {width: Math.max(el.clientWidth, 240), height};
}

/** Keeps a chart as wide as its container. Returns a function that stops it. */
function follow(el, chart, height) {
  const ro = new ResizeObserver(() => chart.setSize(sizeOf(el, height)));
  ro.observe(el);
  return () => ro.disconnect();
}

/** Coalesces redraws to one per frame, however fast trials arrive. */
function scheduler(draw) {
  let pending = false;
  return () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      draw();
    });
  };
}

// whole trial numbers only
const axisTrials = {label: 'trials', size: 40, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000]};

const axisMs = {
  scale: 'ms',
  label: 'latency',
  values: (u, ticks) => ticks.map((v) => (v == null ? null : v >= 1 ? `${+v.toPrecision(3)} ms` : `${+(v * 1000).toPrecision(3)} µs`)),
  size: 70,
};

/**
 * The search curve of one job: best latency so far against trials, every measured trial as a point, error
 * trials as red marks along the top, the untuned baseline as a dashed line and the joint / loop-only stage
 * boundary as a vertical line. Trials go in with `add(trials)` in measurement order (by id).
 */
export class TrialChart {
  constructor(el, {height = 300} = {}) {
    this.el = el;
    this.height = height;
    this.trials = [];
    this.ids = new Set();
    this.baseline = null;
    this.tasks = [];
    this.redraw = scheduler(() => this.draw());
    el.setAttribute('role', 'img');
    this.chart = null;
  }

  setTasks(tasks) {
    const ids = tasks.map((t) => t.id).join();
    if (ids === this.tasks.map((t) => t.id).join()) return;
    this.tasks = tasks;
    this.rebuild();
  }

  setBaseline(ms) {
    if (ms === this.baseline) return;
    this.baseline = ms;
    this.redraw();
  }

  add(trials) {
    let fresh = 0;
    for (const t of trials) {
      if (this.ids.has(t.id)) continue;
      this.ids.add(t.id);
      this.trials.push(t);
      fresh++;
    }
    if (!fresh) return;
    // pages arrive by task and index, events by id: keep measurement order
    const last = this.trials.length - fresh;
    if (last > 0 && this.trials[last - 1].id > this.trials[last].id) this.trials.sort((a, b) => a.id - b.id);
    this.redraw();
  }

  multi() {
    return this.tasks.length > 1;
  }

  series() {
    const best = this.multi()
      ? this.tasks.map((t, i) => ({label: `best: ${t.name} #${t.index}`, stroke: colorOf(i), width: 2, scale: 'ms',
        paths: uPlot.paths.stepped({align: 1}), points: {show: false}, spanGaps: true}))
      : [{label: 'best so far', stroke: colorOf(0), width: 2, scale: 'ms', paths: uPlot.paths.stepped({align: 1}),
        points: {show: false}, spanGaps: true}];
    return [
      {label: 'trial'},
      ...best,
      {label: 'trial latency', stroke: '#64748b', scale: 'ms', paths: () => null,
        points: {show: true, size: 5, fill: '#94a3b8', stroke: '#64748b', width: 1}},
      {label: 'error', stroke: '#dc2626', scale: 'ms', paths: () => null,
        points: {show: true, size: 7, fill: '#dc2626', stroke: '#dc2626', width: 1},
        value: (u, v) => (v === null ? '' : 'error')},
    ];
  }

  data() {
    const xs = [];
    const multi = this.multi();
    const taskPos = new Map(this.tasks.map((t, i) => [t.id, i]));
    const bestCols = (multi ? this.tasks : [null]).map(() => []);
    const bestSoFar = bestCols.map(() => null);
    const points = [];
    const errors = [];
    let top = null;
    for (const t of this.trials) if (t.latency_ms !== null && (top === null || t.latency_ms > top)) top = t.latency_ms;
    if (this.baseline && (top === null || this.baseline > top)) top = this.baseline;
    const errorY = top === null ? 1 : top * 1.5;
    this.trials.forEach((t, i) => {
      xs.push(i + 1);
      const col = multi ? (taskPos.get(t.task_id) ?? 0) : 0;
      if (t.latency_ms !== null && (bestSoFar[col] === null || t.latency_ms < bestSoFar[col])) {
        bestSoFar[col] = t.latency_ms;
      }
      bestCols.forEach((c, j) => c.push(j === col ? bestSoFar[j] : (multi ? null : bestSoFar[j])));
      points.push(t.latency_ms);
      errors.push(t.latency_ms === null ? errorY : null);
    });
    return [xs, ...bestCols, points, errors];
  }

  /** Trial number (1-based, measurement order) of the first loop-only trial after joint ones, or null. */
  stageBoundary() {
    let sawJoint = false;
    for (let i = 0; i < this.trials.length; i++) {
      const stage = this.trials[i].stage;
      if (stage === 'joint') sawJoint = true;
      else if (sawJoint && stage === 'loop') return i + 1;
    }
    return null;
  }

  rebuild() {
    if (this.chart) this.chart.destroy();
    if (this.stopFollow) this.stopFollow();
    const self = this;
    const opts = {
      ...sizeOf(this.el, this.height),
      scales: {x: {time: false}, ms: {distr: 3}},
      axes: [axisTrials, axisMs],
      series: this.series(),
      legend: {live: true},
      cursor: {drag: {x: true, y: false}},
      hooks: {
        draw: [(u) => self.decorate(u)],
      },
    };
    this.el.replaceChildren();
    this.chart = new uPlot(opts, this.data(), this.el);
    this.stopFollow = follow(this.el, this.chart, this.height);
    this.describe();
  }

  decorate(u) {
    const ctx = u.ctx;
    const {left, top, width, height} = u.bbox;
    ctx.save();
    ctx.font = `${12 * devicePixelRatio}px system-ui, sans-serif`;
    if (this.baseline) {
      const y = u.valToPos(this.baseline, 'ms', true);
      if (y >= top && y <= top + height) {
        ctx.strokeStyle = '#64748b';
        ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
        ctx.beginPath();
        ctx.moveTo(left, y);
        ctx.lineTo(left + width, y);
        ctx.stroke();
        ctx.fillStyle = '#475569';
        ctx.fillText('untuned', left + 4 * devicePixelRatio, y - 4 * devicePixelRatio);
      }
    }
    const boundary = this.stageBoundary();
    if (boundary !== null) {
      const x = u.valToPos(boundary - 0.5, 'x', true);
      ctx.strokeStyle = '#7c3aed';
      ctx.setLineDash([]);
      ctx.lineWidth = 2 * devicePixelRatio;
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
      ctx.fillStyle = '#7c3aed';
      ctx.textAlign = 'right';
      ctx.fillText('joint', x - 4 * devicePixelRatio, top + 14 * devicePixelRatio);
      ctx.textAlign = 'left';
      ctx.fillText('loop-only', x + 4 * devicePixelRatio, top + 14 * devicePixelRatio);
    }
    ctx.restore();
  }

  describe() {
    const measured = this.trials.filter((t) => t.latency_ms !== null);
    const best = measured.length ? Math.min(...measured.map((t) => t.latency_ms)) : null;
    const errors = this.trials.length - measured.length;
    const boundary = this.stageBoundary();
    this.el.dataset.points = String(this.trials.length);
    this.el.setAttribute('aria-label', `Best latency against trials: ${this.trials.length} trials, ` +
      `${errors} errors${best !== null ? `, best ${best.toPrecision(4)} ms` : ''}` +
      `${boundary !== null ? `, loop-only stage from trial ${boundary}` : ''}.`);
  }

  draw() {
    if (!this.chart) {
      this.rebuild();
      return;
    }
    this.chart.setData(this.data());
    this.describe();
  }

  destroy() {
    if (this.stopFollow) this.stopFollow();
    if (this.chart) this.chart.destroy();
    this.chart = null;
  }
}

/** Best latency so far against trials for several jobs on one chart (the compare view). */
export function compareChart(el, runs, {height = 320} = {}) {
  const longest = Math.max(0, ...runs.map((r) => r.trials.length));
  const xs = Array.from({length: longest}, (_, i) => i + 1);
  const cols = runs.map((r) => {
    let best = null;
    const col = r.trials.map((t) => {
      if (t.latency_ms !== null && (best === null || t.latency_ms < best)) best = t.latency_ms;
      return best;
    });
    while (col.length < longest) col.push(null);
    return col;
  });
  const opts = {
    ...sizeOf(el, height),
    scales: {x: {time: false}, ms: {distr: 3}},
    axes: [axisTrials, axisMs],
    series: [{label: 'trial'}, ...runs.map((r, i) => ({
      label: r.label, stroke: colorOf(i), width: 2, scale: 'ms', paths: uPlot.paths.stepped({align: 1}),
      points: {show: false}, spanGaps: false,
    }))],
  };
  el.replaceChildren();
  el.setAttribute('role', 'img');
  el.setAttribute('aria-label', `Best latency against trials for ${runs.length} jobs.`);
  el.dataset.series = String(runs.length);
  const chart = new uPlot(opts, [xs, ...cols], el);
  const stop = follow(el, chart, height);
  return () => {
    stop();
    chart.destroy();
  };
}
