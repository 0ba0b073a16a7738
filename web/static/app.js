// The dashboard shell: client-side routing between the views, focus management, the offline banner.
// Each view module exports `render(main, {params, query})` and returns a cleanup function.

import {checkHealth} from './api.js';
import {setNavigator} from './nav.js';
import * as jobs from './views/jobs.js';
import * as job from './views/job.js';
import * as submit from './views/submit.js';
import * as schedules from './views/schedules.js';
import * as compare from './views/compare.js';
import * as devices from './views/devices.js';

const ROUTES = [
  [/^\/$/, jobs, 'jobs'],
  [/^\/jobs\/(\d+)$/, job, 'jobs'],
  [/^\/submit$/, submit, 'submit'],
  [/^\/schedules$/, schedules, 'schedules'],
  [/^\/compare$/, compare, 'compare'],
  [/^\/devices$/, devices, 'devices'],
];

const main = document.getElementById('main');
let cleanup = null;

function match(pathname) {
  for (const [pattern, view, nav] of ROUTES) {
    const m = pattern.exec(pathname);
    if (m) return {view, nav, params: m.slice(1)};
  }
  return null;
}

async function show({focus = false} = {}) {
  if (cleanup) {
    try { cleanup(); } catch (e) { console.error(e); }
    cleanup = null;
  }
  const route = match(location.pathname);
  for (const a of document.querySelectorAll('nav a[data-nav]')) {
    if (route && a.dataset.nav === route.nav) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  main.replaceChildren();
  if (!route) {
    document.title = 'Not found · altune';
    const h1 = document.createElement('h1');
    h1.textContent = 'Page not found';
    main.append(h1);
    return;
  }
  try {
    cleanup = await route.view.render(main, {params: route.params, query: new URLSearchParams(location.search)});
  } catch (e) {
    console.error(e);
    const p = document.createElement('p');
    p.className = 'error-box';
    p.textContent = `This view failed: ${e.message || e}`;
    main.append(p);
  }
  if (focus) {
    const heading = main.querySelector('h1');
    if (heading) {
      heading.setAttribute('tabindex', '-1');
      heading.focus({preventScroll: false});
    }
  }
}

function navigate(url, {replace = false} = {}) {
  if (replace) history.replaceState(null, '', url);
  else history.pushState(null, '', url);
  show({focus: true});
  window.scrollTo(0, 0);
}
setNavigator(navigate);

document.addEventListener('click', (ev) => {
  if (ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
  const a = ev.target.closest('a[href]');
  if (!a || a.target || a.hasAttribute('download')) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || !match(url.pathname)) return;
  ev.preventDefault();
  navigate(url.pathname + url.search);
});

window.addEventListener('popstate', () => show());
checkHealth();
show();
