// One job, live: progress, ETA and stall warning, the search chart, tasks, the best schedule, the trials table.
// The history comes as the server's downsampled chart (at most ~1000 points however many trials: a job of 100,000
// opens as fast as one of 100) and one page of the trials table at a time, paged on demand by cursor; the job's
// event stream, resumed from the chart's last trial, pushes what is measured after.
// A model job leads with the model's end-to-end latency against torch eager and torch.compile (the running
// estimate, labelled so, while it tunes), then its tasks by their share of the model's time, each task's
// schedule on demand. A failed or cancelled job shows no best latency: the error instead.

import {ApiError, getJob, getTrialChart, getTrials, request, serverNow, subscribe} from '../api.js';
import {TrialChart} from '../charts.js';
import {readTarGz} from '../tar.js';
import {
  errorText, fill, fmtConfig, fmtDuration, fmtLayout, fmtMs, fmtSpeedup, h, isActive, isTimeout, jobLabel,
  setTitle, statusBadge, timeEl, workloadOf,
} from '../util.js';

/** Seconds left as a person reads them: "40 s", "3 min", "1 h 5 min". */
function fmtEta(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 90) return `${s} s`;
  const minutes = Math.round(s / 60);
  return minutes < 60 ? `${minutes} min` : `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

/** A failed or cancelled job's best latency is not one to show (a model job's is the running estimate). */
const ended = (job) => job.status === 'failed' || job.status === 'cancelled';

const PAGE_SIZE = 50;
const RECENT = 50; // the newest trials kept for the throughput and the stall warning
const STALL_MIN_SECONDS = 60; // a running job that measured nothing for this long (or 10 typical gaps) is stalled

export function render(main, {params}) {
  const id = Number(params[0]);
  setTitle(`Job ${id}`);
  const view = new JobView(main, id);
  view.start();
  return () => view.stop();
}

class JobView {
  constructor(main, id) {
    this.main = main;
    this.id = id;
    this.job = null;
    this.lastId = 0; // the newest trial the page has: the chart's, then the stream's
    this.recent = []; // the newest trials (up to RECENT), in measurement order (by id)
    this.best = new Map(); // task id -> its fastest trial
    this.stages = {}; // trials per stage
    this.timeouts = 0;
    this.sort = {key: 'order', desc: true};
    this.filter = 'all';
    this.page = 0;
    this.rows = []; // the trials table's page
    this.count = 0; // trials matching the filter
    this.cursors = [null]; // cursors[p]: what asks for page p
    this.tableLoaded = false;
    this.tableSeq = 0;
    this.closeStream = null;
    this.abort = new AbortController();
    this.timer = null;
    this.tableQueued = false;
    this.scriptLoaded = false;
    this.openSchedules = new Set(); // ids of the tasks whose schedule is shown
  }

  async start() {
    this.main.append(h('h1', {}, `Job #${this.id}`), h('p', {class: 'muted', role: 'status'}, 'Loading job…'));
    let job;
    try {
      job = await getJob(this.id, {signal: this.abort.signal});
    } catch (e) {
      if (e.name === 'AbortError') return;
      setTitle(e.status === 404 ? `Job ${this.id} not found` : `Job ${this.id}`);
      fill(this.main, h('h1', {}, e.status === 404 ? `Job #${this.id} not found` : `Job #${this.id}`),
        h('p', {class: 'error-box', role: 'alert'}, errorText(e)), h('p', {}, h('a', {href: '/'}, 'All jobs')));
      if (e.status === 0) window.addEventListener('altune:reconnected', () => this.restart(), {once: true});
      return;
    }
    this.live = isActive(job); // a stream until the job ends (it may end before the chart is in)
    this.layout(job);
    this.update(job);
    this.timer = setInterval(() => this.tick(), 1000);
    this.onReconnect = () => this.refresh();
    window.addEventListener('altune:reconnected', this.onReconnect);
    this.loadHistory();
  }

  restart() {
    this.stop();
    this.main.replaceChildren();
    this.abort = new AbortController();
    this.start();
  }

  stop() {
    this.abort.abort();
    if (this.closeStream) this.closeStream();
    this.closeStream = null;
    clearInterval(this.timer);
    if (this.onReconnect) window.removeEventListener('altune:reconnected', this.onReconnect);
    if (this.chart) this.chart.destroy();
  }

  /** The job's stream from trial `cursor` on (null: from when it connects). */
  listen(cursor) {
    if (this.closeStream || !this.live) return;
    const query = cursor === null ? '' : `?last_event_id=${cursor}`;
    this.closeStream = subscribe(`jobs/${this.id}/events${query}`, {
      job: (job) => this.update(job),
      trial: (trial) => this.addTrials([trial]),
      end: () => {
        if (this.closeStream) this.closeStream();
        this.closeStream = null;
      },
    });
  }

  async refresh() {
    try {
      this.update(await getJob(this.id, {signal: this.abort.signal}));
    } catch { /* the banner says why */ }
  }

  /** The chart and the first page of the table at once; then the stream, from the chart's last trial. */
  async loadHistory() {
    this.setLoading(true);
    if (!this.tableLoaded) this.loadTable(0);
    let chart;
    try {
      chart = await getTrialChart(this.id, {}, {signal: this.abort.signal});
    } catch (e) {
      if (e.name === 'AbortError') return;
      fill(this.els.loading, h('span', {class: 'error-text'}, `Could not load the trials: ${errorText(e)}`),
        ' ', h('button', {type: 'button', onclick: () => this.loadHistory()}, 'Retry'));
      this.listen(null); // live at least
      return;
    }
    this.lastId = Math.max(this.lastId, chart.last_id);
    this.stages = {...chart.stages};
    this.timeouts = chart.timeouts;
    this.best = new Map(chart.best.map((t) => [t.task_id, t]));
    this.chart.load(chart);
    this.setLoading(false);
    this.renderFacts();
    this.renderBest();
    this.renderTasks();
    this.listen(chart.last_id);
  }

  setLoading(loading) {
    const el = this.els.loading;
    el.hidden = !loading;
    if (loading) fill(el, 'Loading the search curve…');
    else el.replaceChildren();
  }

  // -- layout ------------------------------------------------------------------------------------------------

  layout(job) {
    const model = job.kind === 'model';
    const els = {};
    els.title = h('h1', {});
    els.status = h('span', {class: 'head-status'});
    els.actions = h('div', {class: 'actions'});
    els.alerts = h('div', {class: 'alerts'});
    els.headline = h('section', {class: 'headline', id: 'job-headline', 'aria-label': 'End-to-end latency',
      'aria-live': 'polite', hidden: true});
    els.facts = h('dl', {class: 'facts'});
    els.keys = h('details', {class: 'task-keys', id: 'task-keys'});
    els.loading = h('div', {class: 'loading-trials', role: 'status', 'aria-live': 'polite'});
    els.chart = h('div', {class: 'chart', id: 'trial-chart'});
    els.tasks = h('section', {class: 'tasks', hidden: true, 'aria-labelledby': 'tasks-h'});
    els.best = h('div', {class: 'best'});
    els.script = h('pre', {class: 'code', id: 'tvmscript'});
    els.scriptBox = h('details', {class: 'script-box'}, h('summary', {}, 'TVMScript of the best schedule'),
      els.script);
    els.scriptBox.addEventListener('toggle', () => { if (els.scriptBox.open) this.loadScript(); });
    els.filter = h('select', {id: 'trial-filter'},
      h('option', {value: 'all'}, 'all trials'), h('option', {value: 'ok'}, 'measured'),
      h('option', {value: 'error'}, 'errors'));
    els.filter.addEventListener('change', () => {
      this.filter = els.filter.value;
      this.cursors = [null];
      this.loadTable(0);
    });
    els.thead = h('thead');
    els.tbody = h('tbody');
    els.pager = h('nav', {class: 'pager', 'aria-label': 'Trial pages'});
    this.els = els;
    this.chart = new TrialChart(els.chart);

    const search = h('section', {'aria-labelledby': 'chart-h'},
      h('h2', {id: 'chart-h'}, 'Search'),
      h('p', {class: 'muted legend-note'}, 'Best latency so far against trials (log scale); every measured trial ',
        'is a grey point, error trials are red marks at the top, the dashed line is the untuned program.'),
      els.loading, els.chart);
    fill(this.main,
      h('div', {class: 'view-head'}, h('div', {}, els.title, els.status), els.actions),
      els.alerts,
      els.headline,
      els.facts,
      // a model: where its time goes first; each task's schedule is in its row, so no "Best schedule" blocks (a
      // model's artifact has no schedule.py either)
      model ? [els.tasks, search] : [search, els.tasks,
        h('section', {'aria-labelledby': 'best-h'}, h('h2', {id: 'best-h'}, 'Best schedule'), els.best, els.scriptBox)],
      h('section', {'aria-labelledby': 'trials-h'},
        h('div', {class: 'section-head'}, h('h2', {id: 'trials-h'}, 'Trials'),
          h('span', {}, h('label', {for: 'trial-filter'}, 'Show '), els.filter)),
        h('div', {class: 'table-wrap'},
          h('table', {class: model ? 'trials compact' : 'trials', id: 'trials-table'}, els.thead, els.tbody)),
        els.pager));
    this.renderTable();
  }

  // -- state -------------------------------------------------------------------------------------------------

  update(job) {
    const previous = this.job;
    this.job = job;
    setTitle(`Job ${job.id}: ${job.name} (${job.status})`);
    fill(this.els.title, `Job #${job.id} · ${jobLabel(job)}`);
    fill(this.els.status, statusBadge(job), job.cancel_requested && job.status === 'running'
      ? h('span', {class: 'muted'}, ' cancel requested; stopping after the current measurement') : null);
    this.renderActions();
    this.chart.setTasks(job.tasks || []);
    this.chart.setBaseline(job.baseline_ms);
    this.renderHeadline();
    this.renderKeys();
    this.renderTasks();
    this.renderFacts();
    this.renderBest();
    if (previous && isActive(previous) && !isActive(job) && job.has_artifact && this.els.scriptBox.open) {
      this.loadScript();
    }
  }

  /** Trials from the stream, in measurement order. */
  addTrials(list) {
    const fresh = list.filter((t) => t.id > this.lastId);
    if (!fresh.length) return;
    this.lastId = fresh.at(-1).id;
    for (const t of fresh) {
      this.stages[t.stage] = (this.stages[t.stage] || 0) + 1;
      if (isTimeout(t.error)) this.timeouts++;
      const best = this.best.get(t.task_id);
      if (t.latency_ms !== null && (!best || t.latency_ms < best.latency_ms)) this.best.set(t.task_id, t);
    }
    this.remember(fresh);
    this.chart.add(fresh);
    const shown = fresh.filter((t) => this.filter === 'all' || (this.filter === 'ok') === (t.latency_ms !== null));
    if (shown.length && this.page === 0) {
      this.queueTable(); // the first page again, at most once a second
    } else if (shown.length) {
      this.count += shown.length;
      this.renderPager();
    }
    this.renderFacts();
    this.renderBest();
  }

  /** Keeps the newest RECENT trials seen (a page or the stream), in measurement order. */
  remember(trials) {
    const byId = new Map([...this.recent, ...trials].map((t) => [t.id, t]));
    this.recent = [...byId.values()].sort((a, b) => a.id - b.id).slice(-RECENT);
  }

  queueTable() {
    if (this.tableQueued) return;
    this.tableQueued = true;
    setTimeout(() => {
      this.tableQueued = false;
      if (this.page === 0) this.loadTable(0);
    }, 1000);
  }

  stats() {
    const job = this.job;
    const stages = this.stages;
    const timeouts = this.timeouts;
    // throughput from the recent trials' timestamps; before two exist, from the start time
    const recent = this.recent;
    let rate = null; // trials per second
    const times = recent.map((t) => Date.parse(t.created_at));
    // the typical gap between measurements, for the stall threshold
    const gap = times.length >= 2 ? (times.at(-1) - times[0]) / 1000 / (times.length - 1) : 0;
    if (job.status === 'running' && times.length >= 2) {
      // up to now, not to the last trial: the rate (and the ETA) decays while nothing is measured
      rate = (times.length - 1) / (Math.max(serverNow() - times[0], times.at(-1) - times[0], 1000) / 1000);
    } else if (times.length >= 2 && times.at(-1) > times[0]) {
      rate = (times.length - 1) / ((times.at(-1) - times[0]) / 1000);
    } else if (job.started_at && job.trials_done > 0) {
      const end = job.finished_at ? Date.parse(job.finished_at) : serverNow();
      rate = job.trials_done / Math.max((end - Date.parse(job.started_at)) / 1000, 1e-3);
    }
    const lastTrial = recent.length ? Date.parse(recent.at(-1).created_at)
      : job.last_trial_at ? Date.parse(job.last_trial_at) : null;
    const lastActivity = Math.max(lastTrial || 0, job.started_at ? Date.parse(job.started_at) : 0) || null;
    const stallAfter = Math.max(STALL_MIN_SECONDS, 10 * gap);
    const idle = lastActivity ? (serverNow() - lastActivity) / 1000 : null;
    const leaseLost = job.status === 'running' && job.lease_expires_at && Date.parse(job.lease_expires_at) < serverNow();
    return {
      stages, timeouts, rate, idle, leaseLost,
      stalled: job.status === 'running' && idle !== null && idle > stallAfter,
      eta: job.status === 'running' && rate ? Math.max(job.budget - job.trials_done, 0) / rate : null,
    };
  }

  tick() {
    if (this.job && isActive(this.job)) {
      this.renderFacts();
    }
  }

  // -- rendering ---------------------------------------------------------------------------------------------

  renderActions() {
    const job = this.job;
    const items = [];
    if (isActive(job)) {
      const cancel = h('button', {type: 'button', class: 'danger', id: 'cancel-job', disabled: job.cancel_requested},
        job.cancel_requested ? 'Cancelling…' : 'Cancel job');
      cancel.addEventListener('click', async () => {
        cancel.disabled = true;
        cancel.textContent = 'Cancelling…';
        try {
          this.update(await request(`jobs/${job.id}/cancel`, {method: 'POST'}));
        } catch (e) {
          cancel.disabled = false;
          cancel.textContent = 'Cancel job';
          this.flash(`Could not cancel: ${errorText(e)}`);
        }
      });
      items.push(cancel);
    }
    if (job.has_artifact) {
      items.push(h('a', {class: 'button primary', id: 'download-artifact', href: `/api/v1/jobs/${job.id}/artifact`,
        download: `altune-job-${job.id}.tar.gz`}, 'Download artifact'));
    } else {
      items.push(h('button', {type: 'button', disabled: true, title: 'the artifact exists once the job has finished',
        id: 'download-artifact'}, 'Download artifact'));
    }
    items.push(h('a', {class: 'button', href: `/compare?workload=${encodeURIComponent(workloadOf(job))}&ids=${job.id}`},
      'Compare'));
    items.push(h('a', {class: 'button', href: `/submit?from=${job.id}`}, 'Tune again'));
    fill(this.els.actions, items);
  }

  flash(text) {
    this.els.alerts.prepend(h('p', {class: 'error-box flash', role: 'alert'}, text));
  }

  renderFacts() {
    const job = this.job;
    const s = this.stats();
    const alerts = [];
    if (job.status === 'failed') {
      alerts.push(h('div', {class: 'error-box', role: 'alert', id: 'job-error'},
        h('strong', {}, 'The job failed. '), h('pre', {}, job.error || 'no reason recorded')));
    }
    if (s.leaseLost) {
      alerts.push(h('p', {class: 'warn-box stalled', role: 'status'},
        `The worker ${job.worker_id || ''} stopped renewing its lease ${fmtDuration((serverNow() -
          Date.parse(job.lease_expires_at)) / 1000)} ago; another worker will take the job over and resume it.`));
    } else if (s.stalled) {
      alerts.push(h('p', {class: 'warn-box stalled', role: 'status'},
        `Stalled? This job has measured nothing for ${s.idle < 120 ? 'over a minute' : `${Math.floor(s.idle / 60)} minutes`}` +
        `${job.worker_id ? ` (worker ${job.worker_id})` : ''}.`));
    }
    if (job.status === 'queued') {
      alerts.push(h('p', {class: 'info-box'}, 'Queued: waiting for a free worker.'));
    }
    if (job.attempts > 1) {
      alerts.push(h('p', {class: 'info-box'}, `Resumed: claimed ${job.attempts} times (a worker was lost).`));
    }
    const signature = alerts.map((a) => a.textContent).join('\n');
    if (signature !== this.alertSignature) {
      this.alertSignature = signature;
      this.els.alerts.querySelectorAll(':scope > :not(.flash)').forEach((el) => el.remove());
      this.els.alerts.append(...alerts);
    }

    const stageText = Object.keys(s.stages).length > 1 || (s.stages.joint || 0) > 0
      ? Object.entries(s.stages).map(([k, v]) => `${k === 'loop' ? 'loop-only' : k} ${v}`).join(', ') : null;
    const fact = (label, ...value) => h('div', {class: 'fact'}, h('dt', {}, label), h('dd', {}, ...value));
    const duration = job.started_at
      ? ((job.finished_at ? Date.parse(job.finished_at) : serverNow()) - Date.parse(job.started_at)) / 1000 : null;
    const model = job.kind === 'model';
    const report = job.report || {}; // a model job's (service.model_worker): the joint stage, the check, latencies
    fill(this.els.facts,
      fact('Progress', h('progress', {id: 'job-progress', max: job.budget, value: Math.min(job.trials_done, job.budget),
        'aria-label': `${job.trials_done} of ${job.budget} trials`}),
      h('span', {id: 'job-progress-text'}, ` ${job.trials_done} / ${job.budget} trials`),
      stageText ? h('span', {class: 'muted'}, ` (${stageText})`) : null),
      // a model's latencies are the headline's
      model ? null : fact('Best latency', h('strong', {id: 'job-best'}, ended(job) ? '—' : fmtMs(job.best_latency_ms))),
      model ? null : fact('Untuned', fmtMs(job.baseline_ms)),
      report.layout_search?.rounds?.length ? fact('Layout search', `${report.layout_search.rounds.length} `
        + `choices measured: rule ${fmtMs(report.layout_search.rule_estimate_ms)} → chosen `
        + `${fmtMs(report.layout_search.chosen_estimate_ms)} (estimates)`) : null,
      report.check ? fact('Whole-model check', !report.check.passed ? 'failed (not served)'
        : report.check.removed_schedules?.length
          ? `passed after removing ${report.check.removed_schedules.length} wrong schedule(s)` : 'passed') : null,
      model ? null : fact(h('abbr', {title: 'untuned latency / best latency'}, 'Speedup'),
        h('span', {id: 'job-speedup'}, ended(job) ? '—' : fmtSpeedup(job.baseline_ms, job.best_latency_ms))),
      fact('Errors', h('span', {id: 'job-errors'}, `${job.errors}`),
        s.timeouts ? ` (${s.timeouts} timed out)` : job.errors ? ' (0 timed out)' : ''),
      fact('Throughput', s.rate ? `${(s.rate * 60).toFixed(s.rate * 60 >= 10 ? 0 : 1)} trials/min` : '—'),
      fact('ETA', h('span', {id: 'job-eta'}, job.status === 'running'
        ? (s.stalled || s.leaseLost ? 'unknown (stalled)' : s.eta !== null ? `${fmtDuration(s.eta)} left`
          : 'estimating…') : isActive(job) ? 'not started' : '—')),
      fact('Target', job.target),
      fact('Created', timeEl(job.created_at)),
      fact('Started', timeEl(job.started_at)),
      fact('Finished', timeEl(job.finished_at)),
      fact('Duration', fmtDuration(duration)),
      (job.tasks || []).length > 1 ? fact('Task keys', this.els.keys)
        : fact('Workload', h('code', {class: 'wrap'}, workloadOf(job))));
  }

  /** A model's end-to-end latency against torch eager and torch.compile: measured once the job succeeded, the
   * running estimate (labelled so) while it tunes, none when it failed or was cancelled. */
  renderHeadline() {
    const job = this.job;
    const el = this.els.headline;
    el.hidden = job.kind !== 'model';
    if (el.hidden) return;
    const report = job.report || {};
    const measured = report.latency_ms || {};
    // the final report's, else what the worker wrote when it prepared the model (service.model_worker)
    const torch = {eager: measured.torch_eager ?? report.torch_ms?.eager ?? null,
      compile: measured.torch_compile ?? report.torch_ms?.compile ?? null};
    let ours = null;
    let estimate = false;
    let label;
    let note = null;
    if (ended(job)) {
      label = job.status === 'failed' ? 'Failed: no end-to-end latency (the error is above)'
        : 'Cancelled before the model was built: no end-to-end latency';
    } else if (job.status === 'succeeded') {
      ours = measured.artifact ?? job.best_latency_ms;
      label = 'End-to-end latency of the artifact';
      if (measured.untuned) {
        note = h('p', {class: 'muted small', id: 'headline-untuned'},
          `The untuned TVM build takes ${fmtMs(measured.untuned)} (${fmtSpeedup(measured.untuned, ours)} the `
          + 'artifact\'s latency). All measured on the worker.');
      }
    } else if (report.anytime?.latency_ms) {
      // the anytime artifact: built from what was known before measuring, checked and timed like the final one
      ours = report.anytime.latency_ms;
      label = 'Best build so far (checked, downloadable while the job tunes)';
      note = h('p', {class: 'muted small', id: 'headline-anytime'},
        'Built before any measurement from each task\'s stored, transferred or seed schedule. ',
        job.best_latency_ms ? `The tuning's estimate is now ≈ ${fmtMs(job.best_latency_ms)} (each task's best `
          + 'latency times its calls, summed). ' : '',
        'The final build replaces it when the tuning ends.');
    } else if (job.best_latency_ms) {
      ours = job.best_latency_ms;
      estimate = true;
      label = 'Estimated end-to-end latency (while tuning)';
      note = h('p', {class: 'muted small'}, 'An estimate: each task\'s best latency times its calls, summed. The ',
        'whole model is built, checked and timed when the tuning ends.');
    } else {
      label = job.status === 'queued' ? 'Queued: no latency yet' : 'Tuning: no estimate yet';
    }
    const progress = report.progress;
    const eta = !ended(job) && job.status === 'running' && progress && progress.eta_s !== null
      ? h('p', {class: 'muted small', id: 'headline-eta'},
        `${progress.measurements} of ${progress.budget} measurements; about ${fmtEta(progress.eta_s)} left`)
      : null;
    const versus = (name, id, theirs) => h('li', {id},
      theirs === null ? [h('span', {class: 'muted'}, `${name}: not timed`)]
        : ours === null ? [`${name} `, h('strong', {}, fmtMs(theirs))]
          : [h('strong', {class: 'x', title: `${name} latency / ours${estimate ? ' (estimated)' : ''}`},
            fmtSpeedup(theirs, ours)), ` vs ${name}`, h('span', {class: 'muted'}, ` (${fmtMs(theirs)})`)]);
    fill(el,
      h('div', {class: 'headline-main'},
        h('div', {class: 'headline-label'}, label),
        ours === null ? null : h('div', {class: `headline-value${estimate ? ' estimate' : ''}`, id: 'headline-latency'},
          estimate ? '≈ ' : '', fmtMs(ours))),
      h('ul', {class: 'headline-vs'},
        versus('torch eager', 'vs-eager', torch.eager), versus('torch.compile', 'vs-compile', torch.compile)),
      note, eta);
  }

  /** A model's task keys, collapsed (one line each when opened). */
  renderKeys() {
    const tasks = this.job.tasks || [];
    const signature = tasks.map((t) => t.workload_key).join('\n');
    if (signature === this.keysSignature) return;
    this.keysSignature = signature;
    fill(this.els.keys, h('summary', {}, `${tasks.length} tasks`),
      h('ol', {class: 'keys', start: 0}, tasks.map((t) => h('li', {}, h('code', {class: 'wrap'}, t.workload_key)))));
  }

  /** The tasks by their share of the model's time (calls x latency: the best measured, else the untuned), each
   * task's schedule on demand: a row under the task's, built when asked and kept open across updates. */
  renderTasks() {
    const tasks = this.job.tasks || [];
    const el = this.els.tasks;
    if (tasks.length < 2) {
      el.hidden = true;
      return;
    }
    el.hidden = false;
    const time = (t) => (t.best_latency_ms ?? t.baseline_ms ?? null);
    const total = tasks.reduce((sum, t) => sum + (time(t) ?? 0) * t.weight, 0);
    const share = (t) => (total && time(t) !== null ? (100 * time(t) * t.weight) / total : null);
    const rows = tasks.map((t) => ({t, share: share(t)}))
      .sort((a, b) => (b.share ?? -1) - (a.share ?? -1) || a.t.index - b.t.index);
    const top = rows[0].share || 100;
    const columns = [['Share', 'num'], ['Task'], ['Calls', 'num'], ['Best', 'num'], ['Untuned', 'num'],
      ['Speedup', 'num'], ['Trials', 'num'], ['Schedule']];
    fill(el, h('h2', {id: 'tasks-h'}, `Tasks (${tasks.length})`),
      h('p', {class: 'muted legend-note'}, 'By their share of the model\'s time: calls × latency (the best ',
        'measured, else the untuned).'),
      h('div', {class: 'table-wrap'}, h('table', {class: 'tasks-table', id: 'tasks-table'},
        h('thead', {}, h('tr', {}, columns.map(([c, cls]) => h('th', {scope: 'col', class: cls}, c)))),
        h('tbody', {}, rows.map(({t, share: pct}) => [
          h('tr', {class: 'task', dataset: {taskId: t.id, share: pct ?? ''}},
            h('td', {class: 'num share'}, pct === null ? '—' : [h('meter', {min: 0, max: top, value: pct,
              'aria-hidden': 'true'}), ` ${pct.toFixed(1)}%`]),
            h('td', {}, t.name, h('span', {class: 'muted'}, ` #${t.index}`)),
            h('td', {class: 'num'}, t.weight),
            h('td', {class: 'num'}, fmtMs(t.best_latency_ms)), h('td', {class: 'num'}, fmtMs(t.baseline_ms)),
            h('td', {class: 'num'}, fmtSpeedup(t.baseline_ms, t.best_latency_ms)),
            h('td', {class: 'num'}, t.trials_done),
            h('td', {}, this.scheduleButton(t))),
          this.openSchedules.has(t.id) ? h('tr', {class: 'schedule-row'},
            h('td', {colspan: columns.length}, this.schedule(t))) : null])))));
  }

  scheduleButton(task) {
    const open = this.openSchedules.has(task.id);
    return h('button', {type: 'button', class: 'link', 'aria-expanded': String(open),
      'aria-label': `${open ? 'hide' : 'show'} the schedule of task ${task.index}`, onclick: () => {
        if (open) this.openSchedules.delete(task.id); else this.openSchedules.add(task.id);
        this.renderTasks();
        this.els.tasks.querySelector(`tr.task[data-task-id="${task.id}"] button`).focus();
      }}, open ? 'hide' : 'show');
  }

  /** A task's schedule: its configuration (the knobs of its best trial), layout and workload key. */
  schedule(task) {
    const trial = this.bestTrials().get(task.id);
    const layout = trial && trial.extra ? fmtLayout(trial.extra.layout) : null;
    return h('div', {class: 'schedule'},
      h('dl', {class: 'facts small'},
        h('dt', {}, 'Workload'), h('dd', {}, h('code', {class: 'wrap'}, task.workload_key)),
        trial ? [h('dt', {}, 'Best trial'), h('dd', {}, `${fmtMs(trial.latency_ms)} (trial ${trial.index}, `
          + `${trial.stage})`)] : null,
        layout ? [h('dt', {}, 'Layout'), h('dd', {}, h('code', {class: 'layout'}, layout))] : null),
      task.best_config ? h('pre', {class: 'code config'}, JSON.stringify(task.best_config, null, 2))
        : h('p', {class: 'muted'}, 'No schedule measured for this task yet.'));
  }

  /** Each task's fastest trial: the chart's, then the stream's. */
  bestTrials() {
    return this.best;
  }

  renderBest() {
    const job = this.job;
    if (job.kind === 'model') return; // each task's schedule is in the tasks table
    const best = this.bestTrials();
    const tasks = job.tasks && job.tasks.length ? job.tasks : [];
    const blocks = [];
    const entries = tasks.length ? tasks.map((t) => [t, best.get(t.id)]) : [...best.values()].map((b) => [null, b]);
    for (const [task, trial] of entries) {
      const config = (task && task.best_config) || (trial && trial.config);
      if (!config) continue;
      const layout = trial && trial.extra ? fmtLayout(trial.extra.layout) : null;
      blocks.push(h('div', {class: 'best-block'},
        entries.length > 1 && task ? h('h3', {}, `${task.name} #${task.index}`) : null,
        h('dl', {class: 'facts small'},
          h('dt', {}, 'Latency'), h('dd', {}, fmtMs(trial ? trial.latency_ms : task && task.best_latency_ms),
            trial ? h('span', {class: 'muted'}, ` (trial ${trial.index}, ${trial.stage})`) : null),
          h('dt', {}, 'Layout'), h('dd', {}, layout ? h('code', {class: 'layout', id: 'best-layout'}, layout)
            : h('span', {class: 'muted'}, 'default (the tuner recorded no layout)'))),
        h('pre', {class: 'code config', id: 'best-config'}, JSON.stringify(config, null, 2))));
    }
    if (!blocks.length) {
      blocks.push(h('p', {class: 'muted'}, isActive(job) ? 'No candidate has run correctly yet.'
        : 'No candidate ran correctly; see the errors in the trials below.'));
    }
    fill(this.els.best, blocks);
    if (!job.has_artifact && !this.scriptLoaded) {
      fill(this.els.script, isActive(job)
        ? 'The TVMScript comes with the artifact, once the job has finished.'
        : 'This job has no artifact, so no TVMScript.');
    }
  }

  async loadScript() {
    if (this.scriptLoaded || !this.job.has_artifact) return;
    fill(this.els.script, 'Loading the artifact…');
    try {
      const res = await fetch(`/api/v1/jobs/${this.id}/artifact`, {signal: this.abort.signal});
      if (!res.ok) throw new ApiError(res.status, `HTTP ${res.status}`);
      const files = await readTarGz(await res.blob());
      const script = files.get('schedule.py');
      fill(this.els.script, script ? new TextDecoder().decode(script) : 'The artifact has no schedule.py.');
      this.scriptLoaded = true;
    } catch (e) {
      if (e.name !== 'AbortError') fill(this.els.script, `Could not read the artifact: ${errorText(e)}`);
    }
  }

  // -- trials table ------------------------------------------------------------------------------------------

  /** The table's columns; `sort` names how the server pages by it (only measurement order and latency). */
  columns() {
    const multi = (this.job && this.job.tasks && this.job.tasks.length > 1);
    return [
      {key: 'order', label: '#', sort: 'id', cell: (t) => t.index, num: true},
      multi ? {key: 'task', label: 'Task', cell: (t) => this.taskName(t.task_id)} : null,
      {key: 'stage', label: 'Stage', cell: (t) => (t.stage === 'loop' ? 'loop-only' : t.stage)},
      {key: 'latency', label: 'Latency', sort: 'latency', cell: (t) => fmtMs(t.latency_ms), num: true},
      {key: 'predicted', label: 'Predicted', cell: (t) => (t.predicted === null ? '—' : t.predicted.toPrecision(3)),
        num: true},
      {key: 'config', label: 'Configuration', cell: (t) => this.configCell(t)},
      {key: 'error', label: 'Error', cell: (t) => this.errorCell(t)},
      {key: 'time', label: 'Measured', cell: (t) => timeEl(t.created_at)},
    ].filter(Boolean);
  }

  taskName(taskId) {
    const task = (this.job.tasks || []).find((t) => t.id === taskId);
    return task ? `${task.name} #${task.index}` : String(taskId);
  }

  configCell(t) {
    const text = fmtConfig(t.config);
    const layout = t.extra && t.extra.layout ? fmtLayout(t.extra.layout) : null;
    if (this.job.kind === 'model') {
      // a model's trials are many, each of a task with some twenty knobs: one line a trial, the rest when opened
      return h('details', {class: 'cfg-line'}, h('summary', {}, h('code', {class: 'cfg'}, text)),
        layout ? h('div', {class: 'layout small'}, `layout ${layout}`) : null, h('code', {class: 'cfg'}, text));
    }
    return [layout ? h('div', {class: 'layout small'}, `layout ${layout}`) : null, h('code', {class: 'cfg'}, text)];
  }

  errorCell(t) {
    if (!t.error) return '';
    const first = t.error.split('\n')[0];
    if (first.length <= 120 && first === t.error) return h('span', {class: 'error-text'}, t.error);
    return h('details', {class: 'error-detail'}, h('summary', {class: 'error-text'}, first.slice(0, 120)),
      h('pre', {}, t.error));
  }

  /** Page `page` of the table from the server (one indexed query, however many trials the job has). */
  async loadTable(page) {
    const seq = ++this.tableSeq;
    const sort = this.columns().find((c) => c.key === this.sort.key)?.sort || 'id';
    let res;
    try {
      res = await getTrials(this.id, {limit: PAGE_SIZE, sort, order: this.sort.desc ? 'desc' : 'asc',
        status: this.filter, cursor: this.cursors[page]}, {signal: this.abort.signal});
    } catch (e) {
      if (e.name === 'AbortError' || seq !== this.tableSeq) return;
      fill(this.els.tbody, h('tr', {}, h('td', {colspan: this.columns().length, class: 'error-text'},
        `Could not load the trials: ${errorText(e)}`)));
      return;
    }
    if (seq !== this.tableSeq) return; // a later request (another page, sort or filter) answers instead
    this.page = page;
    this.rows = res.data;
    this.count = res.count;
    this.cursors[page + 1] = res.next;
    this.cursors.length = page + 2;
    this.tableLoaded = true;
    if (page === 0 && sort === 'id' && this.sort.desc) {
      this.remember(res.data); // the newest trials: the throughput and the stall warning
      this.renderFacts();
    }
    this.renderTable();
  }

  renderTable() {
    const cols = this.columns();
    fill(this.els.thead, h('tr', {}, cols.map((c) => {
      if (!c.sort) return h('th', {scope: 'col', class: c.num ? 'num' : null}, c.label);
      const active = this.sort.key === c.key;
      const btn = h('button', {type: 'button', class: 'sort', dataset: {sort: c.key}},
        c.label, h('span', {'aria-hidden': 'true'}, active ? (this.sort.desc ? ' ▼' : ' ▲') : ''));
      btn.addEventListener('click', async () => {
        this.sort = {key: c.key, desc: active ? !this.sort.desc : c.key === 'order'};
        this.cursors = [null];
        await this.loadTable(0);
        this.els.thead.querySelector(`button[data-sort="${c.key}"]`)?.focus();
      });
      return h('th', {scope: 'col', class: c.num ? 'num' : null,
        'aria-sort': active ? (this.sort.desc ? 'descending' : 'ascending') : 'none'}, btn);
    })));
    const shown = this.rows;
    fill(this.els.tbody, shown.length ? shown.map((t) => h('tr', {class: t.error ? 'err' : null,
      dataset: {trialId: t.id}}, cols.map((c) => h('td', {class: c.num ? 'num' : null}, c.cell(t)))))
      : h('tr', {}, h('td', {colspan: cols.length, class: 'muted'},
        this.tableLoaded || (this.job && this.job.trials_done === 0) ? 'No trials yet.' : 'Loading trials…')));
    this.renderPager();
  }

  renderPager() {
    const pages = Math.max(1, Math.ceil(this.count / PAGE_SIZE));
    const start = this.page * PAGE_SIZE;
    const go = (p) => () => this.loadTable(p);
    const hasNext = !!this.cursors[this.page + 1];
    fill(this.els.pager,
      h('button', {type: 'button', onclick: go(0), disabled: this.page === 0, 'aria-label': 'first page'}, '«'),
      h('button', {type: 'button', onclick: go(this.page - 1), disabled: this.page === 0,
        'aria-label': 'previous page'}, '‹ Prev'),
      h('span', {class: 'page-info', id: 'trials-page-info'},
        this.rows.length ? `${start + 1}–${start + this.rows.length} of ${this.count}` : `0 of ${this.count}`,
        ` · page ${this.page + 1} of ${pages}`),
      h('button', {type: 'button', onclick: go(this.page + 1), disabled: !hasNext, 'aria-label': 'next page'},
        'Next ›'));
  }
}
