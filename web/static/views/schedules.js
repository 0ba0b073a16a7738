// Schedules: the best known configuration per workload and target, searchable (?search=), with the job that
// found it.

import {request} from '../api.js';
import {debounce, errorText, fill, fmtConfig, fmtMs, h, setTitle, timeEl} from '../util.js';

const PAGE = 50;

export function render(main, {query}) {
  let search = query.get('search') || '';
  let target = query.get('target') || '';
  let offset = 0;
  setTitle(search ? `Schedules matching “${search}”` : 'Schedules');

  const input = h('input', {type: 'search', id: 'schedule-search', name: 'search', value: search,
    placeholder: 'conv2d, in_channels=64, …', autocomplete: 'off'});
  const targetSel = h('select', {id: 'schedule-target'}, h('option', {value: ''}, 'any target'),
    ['host', 'llvm', 'cuda'].map((t) => h('option', {value: t}, t)));
  targetSel.value = target;
  const tbody = h('tbody');
  const state = h('p', {class: 'muted', role: 'status', 'aria-live': 'polite'}, 'Loading schedules…');
  const pager = h('nav', {class: 'pager', 'aria-label': 'Schedule pages'});
  let controller = null;

  main.append(h('h1', {}, 'Schedules'),
    h('p', {class: 'muted'}, 'The best configuration found so far for each workload and target; later jobs on the ',
      'same workload start from it.'),
    h('form', {class: 'toolbar', role: 'search', onsubmit: (ev) => ev.preventDefault()},
      h('label', {for: 'schedule-search'}, 'Workload contains '), input,
      h('label', {for: 'schedule-target'}, 'Target '), targetSel),
    h('div', {class: 'table-wrap'}, h('table', {class: 'schedules', id: 'schedules-table'},
      h('thead', {}, h('tr', {}, ['Workload', 'Target', 'Latency', 'Job', 'Updated', 'Configuration']
        .map((c) => h('th', {scope: 'col', class: c === 'Latency' ? 'num' : null}, c)))),
      tbody)),
    state, pager);

  async function load() {
    if (controller) controller.abort();
    controller = new AbortController();
    const params = new URLSearchParams({limit: PAGE, offset});
    if (search) params.set('search', search);
    if (target) params.set('target', target);
    try {
      const page = await request(`schedules?${params}`, {signal: controller.signal});
      fill(tbody, page.data.map((s) => h('tr', {},
        h('td', {}, h('code', {class: 'wrap'}, s.workload_key)),
        h('td', {}, h('code', {class: 'small'}, s.target_key)),
        h('td', {class: 'num'}, fmtMs(s.latency_ms)),
        h('td', {}, s.job_id === null ? '—' : h('a', {href: `/jobs/${s.job_id}`}, `#${s.job_id}`)),
        h('td', {}, timeEl(s.updated_at)),
        h('td', {}, h('details', {}, h('summary', {}, 'show'), h('code', {class: 'cfg'}, fmtConfig(s.config)))))));
      fill(state, page.count ? `${page.count} schedule${page.count === 1 ? '' : 's'}`
        : search || target ? 'No schedule matches.' : 'No schedules yet: they appear when jobs finish.');
      const pages = Math.max(1, Math.ceil(page.count / PAGE));
      const current = Math.floor(offset / PAGE);
      const go = (p) => () => { offset = p * PAGE; load(); };
      fill(pager, pages > 1 ? [
        h('button', {type: 'button', disabled: current === 0, onclick: go(current - 1)}, '‹ Prev'),
        h('span', {class: 'page-info'}, `page ${current + 1} of ${pages}`),
        h('button', {type: 'button', disabled: current >= pages - 1, onclick: go(current + 1)}, 'Next ›'),
      ] : []);
    } catch (e) {
      if (e.name === 'AbortError') return;
      fill(state, h('span', {class: 'error-text'}, `Could not load schedules: ${errorText(e)}`));
    }
  }

  const sync = () => {
    const params = new URLSearchParams();
    if (search) params.set('search', search);
    if (target) params.set('target', target);
    history.replaceState(null, '', `/schedules${params.size ? `?${params}` : ''}`);
    setTitle(search ? `Schedules matching “${search}”` : 'Schedules');
    offset = 0;
    load();
  };
  input.addEventListener('input', debounce(() => { search = input.value.trim(); sync(); }, 250));
  targetSel.addEventListener('change', () => { target = targetSel.value; sync(); });
  load();
  return () => controller && controller.abort();
}
