// Compare: several jobs of the same workload (two targets, two budgets, ...) as curves on one chart, with their
// best latency and layout. /compare?ids=3,5 shows them; ?workload=KEY lists the jobs of a workload to pick from.

import {getJob, getJobs, getTrialChart} from '../api.js';
import {colorOf, compareChart} from '../charts.js';
import {navigate} from '../nav.js';
import {errorText, fill, fmtLayout, fmtMs, fmtSpeedup, h, jobLabel, setTitle, statusBadge, workloadOf}
  from '../util.js';

export function render(main, {query}) {
  const ids = (query.get('ids') || '').split(',').map(Number).filter((n) => Number.isInteger(n) && n > 0);
  const workload = query.get('workload');
  const controller = new AbortController();
  let destroy = null;
  setTitle('Compare jobs');
  main.append(h('h1', {}, 'Compare jobs'));
  const picker = h('section', {'aria-labelledby': 'pick-h'});
  const result = h('section', {'aria-labelledby': 'cmp-h'});
  main.append(result, picker);

  if (ids.length >= 2) {
    showComparison(result, ids, controller.signal).then((d) => { destroy = d; });
  } else {
    result.remove();
  }
  showPicker(picker, ids, workload, controller.signal);
  return () => {
    controller.abort();
    if (destroy) destroy();
  };
}

async function showComparison(el, ids, signal) {
  const status = h('p', {class: 'muted', role: 'status'}, `Loading ${ids.length} jobs…`);
  fill(el, h('h2', {id: 'cmp-h'}, `Jobs ${ids.map((i) => `#${i}`).join(', ')}`), status);
  let jobs;
  try {
    jobs = await Promise.all(ids.map((id) => getJob(id, {signal})));
  } catch (e) {
    if (e.name !== 'AbortError') fill(status, h('span', {class: 'error-text'}, `Could not load: ${errorText(e)}`));
    return null;
  }
  setTitle(`Compare ${ids.map((i) => `#${i}`).join(', ')}`);
  const workloads = new Set(jobs.map(workloadOf));
  const runs = [];
  for (const job of jobs) {
    fill(status, `Loading the search curve of job #${job.id}…`);
    try {
      runs.push({job, chart: await getTrialChart(job.id, {}, {signal})});
    } catch (e) {
      if (e.name !== 'AbortError') fill(status, h('span', {class: 'error-text'}, `Could not load: ${errorText(e)}`));
      return null;
    }
  }
  status.remove();
  for (const run of runs) run.label = `#${run.job.id} ${run.job.target} budget ${run.job.budget}`;
  const chart = h('div', {class: 'chart', id: 'compare-chart'});
  // the fastest of each task's best trials (the server sends them with the chart)
  const bestOf = (run) => run.chart.best.reduce((b, t) => (!b || t.latency_ms < b.latency_ms ? t : b), null);
  const overall = Math.min(...jobs.map((j) => j.best_latency_ms ?? Infinity));
  el.append(
    workloads.size > 1 ? h('p', {class: 'warn-box'}, 'These jobs tune different workloads; their latencies are ',
      'not comparable: ', [...workloads].join(' / ')) : h('p', {class: 'muted'}, h('code', {class: 'wrap'},
      [...workloads][0])),
    chart,
    h('div', {class: 'table-wrap'}, h('table', {class: 'compare-table', id: 'compare-table'},
      h('thead', {}, h('tr', {}, ['', 'Job', 'Status', 'Target', 'Trials', 'Best', 'vs best', 'Speedup', 'Layout']
        .map((c) => h('th', {scope: 'col'}, c)))),
      h('tbody', {}, runs.map((run, i) => {
        const best = bestOf(run);
        const job = run.job;
        return h('tr', {},
          h('td', {}, h('span', {class: 'swatch', style: `background:${colorOf(i)}`, 'aria-hidden': 'true'})),
          h('td', {}, h('a', {href: `/jobs/${job.id}`}, `#${job.id}`), ' ', jobLabel(job)),
          h('td', {}, statusBadge(job)), h('td', {}, job.target),
          h('td', {class: 'num'}, `${job.trials_done} / ${job.budget}`),
          h('td', {class: 'num'}, fmtMs(job.best_latency_ms)),
          h('td', {class: 'num'}, job.best_latency_ms ? `${(job.best_latency_ms / overall).toFixed(2)}×` : '—'),
          h('td', {class: 'num'}, fmtSpeedup(job.baseline_ms, job.best_latency_ms)),
          h('td', {}, best && best.extra && best.extra.layout ? h('code', {}, fmtLayout(best.extra.layout)) : '—'));
      })))));
  return compareChart(chart, runs);
}

async function showPicker(el, ids, workload, signal) {
  fill(el, h('h2', {id: 'pick-h'}, ids.length >= 2 ? 'Change the selection' : 'Pick jobs to compare'),
    h('p', {class: 'muted', role: 'status'}, 'Loading jobs…'));
  let jobs;
  try {
    jobs = (await getJobs({limit: 500}, {signal})).data;
  } catch (e) {
    if (e.name !== 'AbortError') fill(el.querySelector('p'), `Could not load jobs: ${errorText(e)}`);
    return;
  }
  const groups = new Map();
  for (const job of jobs) {
    const key = workloadOf(job);
    if (workload && key !== workload) continue;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(job);
  }
  const chosen = new Set(ids);
  const button = h('button', {type: 'submit', class: 'primary', id: 'compare-go'}, 'Compare');
  const form = h('form', {class: 'picker'},
    [...groups].map(([key, list]) => h('fieldset', {},
      h('legend', {}, h('code', {class: 'wrap'}, key)),
      list.map((job) => h('label', {class: 'check'},
        h('input', {type: 'checkbox', name: 'job', value: job.id, checked: chosen.has(job.id)}),
        ` #${job.id} `, statusBadge(job), ` ${job.target}, budget ${job.budget}, best ${fmtMs(job.best_latency_ms)}`)))),
    groups.size ? button : h('p', {class: 'muted'}, 'No jobs to compare yet.'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const picked = [...form.querySelectorAll('input[name=job]:checked')].map((i) => i.value);
    if (picked.length < 2) {
      button.setCustomValidity?.('pick at least two jobs');
      button.reportValidity?.();
      button.setCustomValidity?.('');
      return;
    }
    navigate(`/compare?ids=${picked.join(',')}${workload ? `&workload=${encodeURIComponent(workload)}` : ''}`);
  });
  fill(el, h('h2', {id: 'pick-h'}, ids.length >= 2 ? 'Change the selection' : 'Pick jobs to compare'),
    workload ? h('p', {class: 'muted'}, 'Jobs of this workload. ', h('a', {href: '/compare'}, 'All workloads')) : null,
    form);
}
