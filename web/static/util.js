// DOM building and number/time formatting shared by the views. Text always goes in as text nodes, never HTML.

/**
 * Makes an element: h('a', {href: '/x', class: 'y', onclick: fn}, 'text', child, ...).
 * Attributes set to null/undefined/false are left out; `true` sets an empty attribute.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key === 'value' && 'value' in el) el.value = value;
    else el.setAttribute(key, value === true ? '' : value);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function setTitle(...parts) {
  document.title = [...parts, 'altune'].filter(Boolean).join(' · ');
}

// -- numbers -----------------------------------------------------------------------------------------------

/** A latency in ms, with units that keep 3-4 significant digits. */
export function fmtMs(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '—';
  if (ms < 1) return `${(ms * 1000).toPrecision(3)} µs`;
  if (ms < 1000) return `${ms.toPrecision(4)} ms`;
  return `${(ms / 1000).toPrecision(4)} s`;
}

export function fmtSpeedup(baseline, best) {
  if (!baseline || !best) return '—';
  const x = baseline / best;
  return `${x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2)}×`;
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return '—';
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/** A timestamp from the API as local date and time; the full ISO string goes in the title. */
export function fmtTime(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  const pad = (n) => String(n).padStart(2, '0');
  const today = new Date();
  const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  if (d.toDateString() === today.toDateString()) return time;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time}`;
}

export function timeEl(iso) {
  return iso ? h('time', {datetime: iso, title: iso}, fmtTime(iso)) : '—';
}

// -- jobs --------------------------------------------------------------------------------------------------

export const ACTIVE = ['queued', 'running'];
export const isActive = (job) => ACTIVE.includes(job.status);

/** "dense m=32 n=32 k=32 +relu" from a job's spec. */
export function jobLabel(job) {
  const spec = job.spec || {};
  const params = Object.entries(spec.params || {}).map(([k, v]) => `${k}=${v}`).join(' ');
  const epilogue = spec.epilogue && spec.epilogue !== 'none' ? ` +${spec.epilogue}` : '';
  return `${job.name}${params ? ' ' + params : ''}${epilogue}`;
}

/** The workload a job tunes: its first task's key once a worker made it, else one built from the spec. */
export function workloadOf(job) {
  if (job.tasks && job.tasks.length) return job.tasks.map((t) => t.workload_key).join(' + ');
  const spec = job.spec || {};
  const params = Object.entries(spec.params || {}).sort(([a], [b]) => a.localeCompare(b))
    .map(([k, v]) => `${k}=${v}`).join(',');
  return `${job.name}[${params}]:${spec.dtype || 'float32'}:${spec.epilogue || 'none'}`;
}

export function statusBadge(job) {
  let label = job.status;
  if (job.status === 'running' && job.cancel_requested) label = 'cancelling';
  return h('span', {class: `badge s-${job.status}`, dataset: {status: job.status}}, label);
}

export function progressBar(job, extra = {}) {
  const done = Math.min(job.trials_done, job.budget);
  return h('span', {class: 'progress-cell'},
    h('progress', {max: job.budget, value: done, 'aria-label': `${job.trials_done} of ${job.budget} trials`,
      ...extra}),
    h('span', {class: 'progress-text'}, `${job.trials_done} / ${job.budget}`,
      job.errors ? h('span', {class: 'err-count', title: 'error trials'}, ` · ${job.errors} err`) : null));
}

/** A trial's configuration in one line: `tile_x=4 tile_y=16 ...`; nested values as JSON. */
export function fmtConfig(config) {
  if (!config) return '';
  return Object.entries(config).map(([k, v]) => `${k}=${typeof v === 'object' ? JSON.stringify(v) : v}`).join(' ');
}

/** A layout as the tuner records it (a string, a list of axes, or an object per tensor) in readable form. */
export function fmtLayout(layout) {
  if (layout === null || layout === undefined) return null;
  if (typeof layout === 'string') return layout;
  if (Array.isArray(layout)) return layout.join(' ');
  return Object.entries(layout).map(([k, v]) => `${k}: ${fmtLayout(v)}`).join('\n');
}

export const isTimeout = (error) => !!error && /time ?out|timed out/i.test(error);

/** Debounces a function. */
export function debounce(fn, ms) {
  let t = null;
  return (...args) => {
    clearTimeout(t);
    t = setTimeout(() => fn(...args), ms);
  };
}

/** Error text for a failed request, for a view's error box. */
export function errorText(e) {
  if (e && e.status === 0) return 'The server is unreachable.';
  if (e && e.detail !== undefined) return typeof e.detail === 'string' ? e.detail : JSON.stringify(e.detail);
  return String(e);
}
