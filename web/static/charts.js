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
const axisTrials = {label: 'trials', size: 40, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000,
  5000, 10000, 20000, 50000, 100000, 200000, 500000]};

const axisMs = {
  scale: 'ms',
  label: 'latency',
  values: (u, ticks) => ticks.map((v) => (v == null ? null : v >= 1 ? `${+v.toPrecision(3)} ms` : `${+(v * 1000).toPrecision(3)} µs`)),
  size: 70,
};

const MAX_POINTS = 2000; // streamed trials beyond this many points are merged pairwise

/** Two adjacent buckets as one (the figures of both; the best so far at the end of the second). */
function merge(a, b) {
  const lo = [a.min_ms, b.min_ms].filter((v) => v !== null);
  const hi = [a.max_ms, b.max_ms].filter((v) => v !== null);
  return {first: a.first, last: b.last, errors: a.errors + b.errors, min_ms: lo.length ? Math.min(...lo) : null,
    max_ms: hi.length ? Math.max(...hi) : null, best_ms: b.best_ms};
}

/**
 * The search curve of one job: best latency so far against trials, the measured trials as points, error trials as
 * red marks along the top, the untuned baseline as a dashed line and the joint / loop-only stage boundary as a
 * vertical line. The history comes downsampled by the server (`load(chart)`, `GET /jobs/{id}/trials/chart`: at
 * most ~1000 buckets of consecutive trials, each drawn at its last trial with its fastest and slowest latency);
 * trials streamed after it go in with `add(trials)`, one point each.
 */
export class TrialChart {
  constructor(el, {height = 300} = {}) {
    this.el = el;
    this.height = height;
    this.points = []; // {first, last, errors, min_ms, max_ms, best_ms}
    this.steps = []; // {task_id, last, best_ms}: where each task's best improved
    this.count = 0;
    this.best = null;
    this.taskBest = new Map();
    this.boundary = null;
    this.sawJoint = false;
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

  /** The server's downsampled history (a `TrialChartPublic`); replaces what was drawn. */
  load(chart) {
    this.points = chart.points.slice();
    this.steps = chart.task_best.slice();
    this.count = chart.count;
    this.best = chart.points.length ? chart.points.at(-1).best_ms : null;
    this.taskBest = new Map();
    for (const s of this.steps) this.taskBest.set(s.task_id, s.best_ms);
    this.boundary = chart.stage_boundary;
    this.sawJoint = (chart.stages.joint || 0) > 0;
    this.redraw();
  }

  /** Trials measured after the history, in measurement order (by id): one point each. */
  add(trials) {
    for (const t of trials) {
      const n = ++this.count;
      const ms = t.latency_ms;
      if (ms !== null && (this.best === null || ms < this.best)) this.best = ms;
      if (ms !== null && (!this.taskBest.has(t.task_id) || ms < this.taskBest.get(t.task_id))) {
        this.taskBest.set(t.task_id, ms);
        this.steps.push({task_id: t.task_id, last: n, best_ms: ms});
      }
      this.points.push({first: n, last: n, errors: ms === null ? 1 : 0, min_ms: ms, max_ms: ms, best_ms: this.best});
      if (this.boundary === null) {
        if (t.stage === 'joint') this.sawJoint = true;
        else if (this.sawJoint && t.stage === 'loop') this.boundary = n;
      }
    }
    if (this.points.length > MAX_POINTS) {
      const merged = [];
      for (let i = 0; i < this.points.length; i += 2) {
        merged.push(i + 1 < this.points.length ? merge(this.points[i], this.points[i + 1]) : this.points[i]);
      }
      this.points = merged;
    }
    if (trials.length) this.redraw();
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
      {label: 'slowest of the bucket', stroke: '#94a3b8', scale: 'ms', paths: () => null,
        points: {show: true, size: 4, fill: '#cbd5e1', stroke: '#94a3b8', width: 1}},
      {label: 'error', stroke: '#dc2626', scale: 'ms', paths: () => null,
        points: {show: true, size: 7, fill: '#dc2626', stroke: '#dc2626', width: 1},
        value: (u, v) => (v === null ? '' : 'error')},
    ];
  }

  data() {
    const points = this.points;
    const xs = points.map((p) => p.last);
    let top = null;
    for (const p of points) if (p.max_ms !== null && (top === null || p.max_ms > top)) top = p.max_ms;
    if (this.baseline && (top === null || this.baseline > top)) top = this.baseline;
    const errorY = top === null ? 1 : top * 1.5;
    let bestCols;
    if (this.multi()) {
      // each task's steps at the point of the bucket they fall in, nothing between (the line spans the gaps)
      const col = new Map(this.tasks.map((t, i) => [t.id, i]));
      bestCols = this.tasks.map(() => points.map(() => null));
      const steps = [...this.steps].sort((a, b) => a.last - b.last);
      let i = 0;
      for (const s of steps) {
        while (i < points.length - 1 && points[i].last < s.last) i++;
        const c = col.get(s.task_id);
        if (c !== undefined) bestCols[c][i] = s.best_ms;
      }
      // and at the last point, where each task stands now
      for (const [taskId, c] of col) {
        if (this.taskBest.has(taskId) && points.length) bestCols[c][points.length - 1] = this.taskBest.get(taskId);
      }
    } else {
      bestCols = [points.map((p) => p.best_ms)];
    }
    return [xs, ...bestCols, points.map((p) => p.min_ms),
      points.map((p) => (p.last > p.first ? p.max_ms : null)),
      points.map((p) => (p.errors ? errorY : null))];
  }

  /** Trial number (1-based, measurement order) of the first loop-only trial after joint ones, or null. */
  stageBoundary() {
    return this.boundary;
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
    const errors = this.points.reduce((n, p) => n + p.errors, 0);
    const boundary = this.stageBoundary();
    this.el.dataset.points = String(this.count);
    this.el.setAttribute('aria-label', `Best latency against trials: ${this.count} trials, ` +
      `${errors} errors${this.best !== null ? `, best ${this.best.toPrecision(4)} ms` : ''}` +
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

/**
 * Best latency so far against trials for several jobs on one chart (the compare view): each run's `chart` is the
 * server's downsampled history (`GET /jobs/{id}/trials/chart`), drawn at its buckets' last trials.
 */
export function compareChart(el, runs, {height = 320} = {}) {
  const xs = [...new Set(runs.flatMap((r) => r.chart.points.map((p) => p.last)))].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const cols = runs.map((r) => {
    const col = xs.map(() => null);
    for (const p of r.chart.points) col[at.get(p.last)] = p.best_ms;
    return col;
  });
  const opts = {
    ...sizeOf(el, height),
    scales: {x: {time: false}, ms: {distr: 3}},
    axes: [axisTrials, axisMs],
    series: [{label: 'trial'}, ...runs.map((r, i) => ({
      label: r.label, stroke: colorOf(i), width: 2, scale: 'ms', paths: uPlot.paths.stepped({align: 1}),
      points: {show: false}, spanGaps: true,
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
