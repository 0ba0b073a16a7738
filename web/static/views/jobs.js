// Jobs: every job, newest first, live from the jobs event stream; filter by status; pick jobs to compare.

import {getJobs, subscribe} from '../api.js';
import {navigate} from '../nav.js';
import {
  debounce, errorText, fill, fmtMs, fmtSpeedup, h, isActive, jobLabel, progressBar, setTitle, statusBadge, timeEl,
} from '../util.js';

const STATUSES = ['queued', 'running', 'succeeded', 'failed', 'cancelled'];
const PAGE = 50;

export function render(main, {query}) {
  const status = STATUSES.includes(query.get('status')) ? query.get('status') : '';
  setTitle(status ? `Jobs (${status})` : 'Jobs');
  const rows = new Map(); // job id -> {tr, job}
  const selected = new Set();
  let offset = 0;
  let total = 0;

  const filter = h('select', {id: 'status-filter', name: 'status'},
    h('option', {value: ''}, 'all'),
    STATUSES.map((s) => h('option', {value: s}, s)));
  filter.value = status;
  filter.addEventListener('change', () => navigate(filter.value ? `/?status=${filter.value}` : '/', {replace: true}));

  const compareBtn = h('button', {type: 'button', id: 'compare-selected', disabled: true}, 'Compare selected');
  compareBtn.addEventListener('click', () => navigate(`/compare?ids=${[...selected].sort((a, b) => a - b).join(',')}`));

  const tbody = h('tbody');
  const state = h('p', {class: 'muted', role: 'status', 'aria-live': 'polite'}, 'Loading jobs…');
  const more = h('button', {type: 'button', hidden: true}, 'Load more');
  more.addEventListener('click', () => load(offset));

  main.append(
    h('div', {class: 'view-head'},
      h('h1', {}, 'Jobs'),
      h('a', {class: 'button primary', href: '/submit'}, 'Submit a job')),
    h('div', {class: 'toolbar'},
      h('label', {for: 'status-filter'}, 'Status '), filter,
      compareBtn),
    h('div', {class: 'table-wrap'},
      h('table', {class: 'jobs', id: 'jobs-table'},
        h('caption', {class: 'sr-only'}, 'Jobs, newest first; updates live'),
        h('thead', {}, h('tr', {},
          h('th', {scope: 'col'}, h('span', {class: 'sr-only'}, 'Select')),
          h('th', {scope: 'col'}, 'Job'),
          h('th', {scope: 'col'}, 'Status'),
          h('th', {scope: 'col', class: 'opt'}, 'Target'),
          h('th', {scope: 'col'}, 'Progress'),
          h('th', {scope: 'col', class: 'num'}, 'Best'),
          h('th', {scope: 'col', class: 'num'}, h('abbr', {title: 'untuned latency / best latency'}, 'Speedup')),
          h('th', {scope: 'col', class: 'opt'}, 'Started'),
          h('th', {scope: 'col', class: 'opt'}, 'Finished'))),
        tbody)),
    state, more);

  /** A failed or cancelled job has no best latency to show (its error is under its name); a model job's is the
   * running estimate while it tunes. */
  function bestCell(job) {
    if (job.status === 'failed' || job.status === 'cancelled') {
      return h('td', {class: 'num best', title: `${job.status}: no latency`}, '—');
    }
    if (job.kind === 'model' && isActive(job) && job.best_latency_ms !== null) {
      return h('td', {class: 'num best', title: 'estimated while tuning; measured end to end when it finishes'},
        `≈ ${fmtMs(job.best_latency_ms)}`);
    }
    return h('td', {class: 'num best'}, fmtMs(job.best_latency_ms));
  }

  function rowOf(job) {
    const ended = job.status === 'failed' || job.status === 'cancelled';
    const box = h('input', {type: 'checkbox', 'aria-label': `select job ${job.id} to compare`,
      checked: selected.has(job.id)});
    box.addEventListener('change', () => {
      if (box.checked) selected.add(job.id); else selected.delete(job.id);
      compareBtn.disabled = selected.size < 2;
    });
    return h('tr', {dataset: {jobId: job.id, status: job.status}},
      h('td', {}, box),
      h('td', {}, h('a', {href: `/jobs/${job.id}`}, `#${job.id}`), ' ', h('span', {class: 'job-label'}, jobLabel(job)),
        job.status === 'failed' && job.error
          ? h('div', {class: 'row-error', title: job.error}, job.error.split('\n')[0]) : null),
      h('td', {}, statusBadge(job)),
      h('td', {class: 'opt'}, job.target),
      h('td', {}, progressBar(job)),
      bestCell(job),
      h('td', {class: 'num speedup'}, ended ? '—' : fmtSpeedup(job.baseline_ms, job.best_latency_ms)),
      h('td', {class: 'opt'}, timeEl(job.started_at)),
      h('td', {class: 'opt'}, timeEl(job.finished_at)));
  }

  function put(job, {prepend = false} = {}) {
    const tr = rowOf(job);
    const old = rows.get(job.id);
    if (old) old.tr.replaceWith(tr);
    else if (prepend) tbody.prepend(tr);
    else tbody.append(tr);
    rows.set(job.id, {tr, job});
  }

  function summarize() {
    if (!rows.size) {
      fill(state, status ? `No ${status} jobs. ` : 'No jobs yet. ', h('a', {href: '/submit'}, 'Submit one'), '.');
    } else {
      fill(state, `Showing ${rows.size} of ${total} job${total === 1 ? '' : 's'}; updates live.`);
    }
    more.hidden = offset >= total;
  }

  let loading = null;
  async function load(from) {
    const controller = new AbortController();
    loading = controller;
    try {
      const page = await getJobs({status, limit: PAGE, offset: from}, {signal: controller.signal});
      if (from === 0) {
        rows.clear();
        tbody.replaceChildren();
      }
      total = page.count;
      for (const job of page.data) put(job);
      offset = from + page.data.length;
      summarize();
    } catch (e) {
      if (e.name === 'AbortError') return;
      fill(state, h('span', {class: 'error-text'}, `Could not load jobs: ${errorText(e)}`));
    }
  }
  const reload = debounce(() => load(0), 200);

  // the stream first: every (re)connection reloads the first page, so nothing falls between the two
  const close = subscribe('events', {
    open: reload,
    job: (job) => {
      const known = rows.get(job.id);
      const matches = !status || job.status === status;
      if (known && !matches) {
        known.tr.remove();
        rows.delete(job.id);
        total = Math.max(0, total - 1);
      } else if (known) {
        put(job);
      } else if (matches) {
        const newest = Math.max(0, ...rows.keys());
        if (job.id > newest) {
          put(job, {prepend: true});
          total += 1;
          offset += 1;
        } else {
          reload();
          return;
        }
      }
      summarize();
    },
  }, {resumeParam: null});
  const onReconnect = () => reload();
  window.addEventListener('altune:reconnected', onReconnect);

  return () => {
    close();
    if (loading) loading.abort();
    window.removeEventListener('altune:reconnected', onReconnect);
  };
}
