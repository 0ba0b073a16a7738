// Devices: the TVM RPC tracker's queue per device key (GET /api/v1/devices), refreshed every few seconds.
// A job that names one of these keys as its `device` is built on a worker and measured on a leased device.

import {request} from '../api.js';
import {errorText, fill, h, setTitle} from '../util.js';

const REFRESH_MS = 5000;

export function render(main) {
  setTitle('Devices');
  const tbody = h('tbody');
  const state = h('p', {class: 'muted', role: 'status', 'aria-live': 'polite'}, 'Loading devices…');
  main.append(h('h1', {}, 'Devices'),
    h('p', {class: 'muted'}, 'Devices registered with the RPC tracker, by key: a job naming a key as its ',
      h('code', {}, 'device'), ' is measured on one of them.'),
    h('div', {class: 'table-wrap'}, h('table', {class: 'devices', id: 'devices-table'},
      h('thead', {}, h('tr', {}, ['Key', 'Total', 'Free', 'Pending']
        .map((c) => h('th', {scope: 'col', class: c === 'Key' ? null : 'num'}, c)))),
      tbody)),
    state);
  let controller = null;
  let timer = null;

  async function load() {
    controller = new AbortController();
    try {
      const page = await request('devices', {signal: controller.signal});
      fill(tbody, page.data.map((d) => h('tr', {},
        h('td', {}, h('code', {}, d.key)),
        h('td', {class: 'num'}, String(d.total)),
        h('td', {class: 'num'}, String(d.free)),
        h('td', {class: 'num'}, String(d.pending)))));
      fill(state, page.tracker === null
        ? 'No RPC tracker configured (ALTUNE_RPC_TRACKER): every job is measured on its worker.'
        : page.count ? `Tracker ${page.tracker}: ${page.count} key${page.count === 1 ? '' : 's'}`
          : `Tracker ${page.tracker}: no device registered.`);
    } catch (e) {
      if (e.name === 'AbortError') return;
      fill(state, h('span', {class: 'error-text'}, `Could not load devices: ${errorText(e)}`));
    }
    timer = setTimeout(load, REFRESH_MS);
  }
  load();
  return () => {
    clearTimeout(timer);
    if (controller) controller.abort();
  };
}
