// The REST API and the event stream, with the "server unreachable" banner.
// Everything the dashboard shows comes through here, from the public API only.

export const API = '/api/v1';

export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === 'string' ? detail : `HTTP ${status}`);
    this.status = status;
    this.detail = detail;
  }
}

// -- the token ---------------------------------------------------------------------------------------------
// `altune serve` prints a URL with `?token=...` (as Jupyter does). The token is kept for this browser session
// (sessionStorage), taken out of the address bar, sent as `Authorization: Bearer` with every request, and set
// as a cookie for what cannot carry a header: the event streams and download links (the server takes the
// cookie on GET only).

const TOKEN_KEY = 'altune_token';

function useToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value);
  document.cookie = `${TOKEN_KEY}=${value}; path=/; SameSite=Strict`;
}

function adoptToken() {
  const url = new URL(location.href);
  const given = url.searchParams.get('token');
  if (given) {
    url.searchParams.delete('token');
    history.replaceState(history.state, '', url.pathname + url.search + url.hash);
  }
  const token = given || sessionStorage.getItem(TOKEN_KEY);
  if (token) useToken(token);
  return token;
}

const token = adoptToken();

/** A 401: say what the server wants and offer a field to paste a token into. */
function askForToken(detail) {
  const el = document.getElementById('banner');
  if (!el || el.querySelector('#token-form')) return;
  el.hidden = false;
  el.replaceChildren();
  const form = document.createElement('form');
  form.id = 'token-form';
  const text = document.createElement('p');
  text.textContent = `This server needs a token. ${detail}. Open the URL \`altune serve\` printed, or paste a token:`;
  const input = Object.assign(document.createElement('input'), {id: 'token-input', type: 'password',
    autocomplete: 'off', placeholder: 'alt_...'});
  input.setAttribute('aria-label', 'API token');
  const button = Object.assign(document.createElement('button'), {type: 'submit', textContent: 'Use token'});
  form.append(text, input, button);
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    if (!input.value.trim()) return;
    useToken(input.value.trim());
    location.reload();
  });
  el.append(form);
}

// -- connectivity ------------------------------------------------------------------------------------------

let down = false;
let healthTimer = null;
let serverOffsetMs = 0; // server clock minus ours, from the Date header

/** Milliseconds since the epoch on the server's clock (for "nothing measured for N s"). */
export function serverNow() {
  return Date.now() + serverOffsetMs;
}

function banner(text) {
  const el = document.getElementById('banner');
  if (!el) return;
  el.hidden = !text;
  el.textContent = text || '';
}

function markDown(reason) {
  banner(`Cannot reach the altune server at ${location.origin} (${reason}). Retrying every few seconds; ` +
    'what you see may be out of date.');
  document.body.classList.add('offline');
  if (!down) {
    down = true;
    scheduleHealth(1000);
  }
}

function markUp() {
  if (!down) return;
  down = false;
  banner('');
  document.body.classList.remove('offline');
  window.dispatchEvent(new CustomEvent('altune:reconnected'));
}

function scheduleHealth(ms) {
  clearTimeout(healthTimer);
  healthTimer = setTimeout(checkHealth, ms);
}

/** Asks /healthz; shows or hides the banner. Returns true when the server and its database answer. */
export async function checkHealth() {
  let res;
  try {
    res = await fetch('/healthz', {cache: 'no-store'});
  } catch {
    markDown('no answer');
    scheduleHealth(3000);
    return false;
  }
  if (res.ok) {
    markUp();
    return true;
  }
  let detail = `HTTP ${res.status}`;
  try { detail = (await res.json()).detail || detail; } catch { /* not JSON */ }
  markDown(detail);
  scheduleHealth(3000);
  return false;
}

// -- requests ----------------------------------------------------------------------------------------------

/**
 * fetch() against the API; JSON in and out, or a FormData body sent as multipart (the browser sets the boundary).
 * Throws ApiError (status 0 when the server is unreachable).
 */
export async function request(path, {method = 'GET', body, signal} = {}) {
  const json = body !== undefined && !(body instanceof FormData);
  const headers = json ? {'Content-Type': 'application/json'} : {};
  if (token) headers.Authorization = `Bearer ${token}`;
  let res;
  try {
    res = await fetch(path.startsWith('/') ? path : `${API}/${path}`, {
      method,
      signal,
      headers,
      body: json ? JSON.stringify(body) : body,
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    markDown('no answer');
    throw new ApiError(0, 'the server is unreachable');
  }
  const date = Date.parse(res.headers.get('date') || '');
  if (!Number.isNaN(date)) {
    // the header has whole seconds: only a clearly skewed clock is worth correcting
    const skew = date + 500 - Date.now();
    serverOffsetMs = Math.abs(skew) > 2000 ? skew : 0;
  }
  if (res.status === 503) {
    checkHealth();
  } else {
    markUp();
  }
  const type = res.headers.get('content-type') || '';
  const data = type.includes('json') ? await res.json() : null;
  if (res.status === 401) askForToken(data && typeof data.detail === 'string' ? data.detail : 'HTTP 401.');
  if (!res.ok) throw new ApiError(res.status, data && data.detail !== undefined ? data.detail : `HTTP ${res.status}`);
  return data;
}

export const getJob = (id, opts) => request(`jobs/${id}`, opts);
export const getZooModels = (opts) => request('models/zoo', opts);
export const getJobs = ({status, limit = 50, offset = 0} = {}, opts) =>
  request(`jobs?${new URLSearchParams({...(status ? {status} : {}), limit, offset})}`, opts);

/** A job's search curve, downsampled by the server to at most `points` buckets however many trials it has. */
export const getTrialChart = (id, {points = 1000} = {}, opts) =>
  request(`jobs/${id}/trials/chart?points=${points}`, opts);

/**
 * One page of a job's trials: `{data, count, next}`; pass `next` back as `cursor` for the page after it.
 * `sort`: 'id' (measurement order) or 'latency'; `order`: 'asc' or 'desc'; `status`: 'all', 'ok' or 'error'.
 */
export const getTrials = (id, {limit = 50, sort = 'id', order = 'desc', status = 'all', cursor = null} = {}, opts) =>
  request(`jobs/${id}/trials?${new URLSearchParams({limit, sort, order, status, ...(cursor ? {cursor} : {})})}`, opts);

// -- events ------------------------------------------------------------------------------------------------

/**
 * Subscribes to a server-sent event stream. `handlers` maps event names to callbacks taking the parsed JSON
 * (and the event); `open` runs on every (re)connection. The browser reconnects on its own with Last-Event-ID;
 * when the server refuses (a 503, or a restart that closed the stream for good) this reopens it with the last
 * id as `?last_event_id=`. Returns a function that closes it.
 */
export function subscribe(path, handlers, {resumeParam = 'last_event_id'} = {}) {
  let source = null;
  let lastId = null;
  let closed = false;
  let retry = null;

  const open = () => {
    const url = new URL(path.startsWith('/') ? path : `${API}/${path}`, location.origin);
    if (lastId !== null && resumeParam) url.searchParams.set(resumeParam, lastId);
    source = new EventSource(url);
    source.addEventListener('open', () => {
      markUp();
      if (handlers.open) handlers.open();
    });
    for (const [name, fn] of Object.entries(handlers)) {
      if (name === 'open' || name === 'error') continue;
      source.addEventListener(name, (ev) => {
        if (ev.lastEventId) lastId = ev.lastEventId;
        fn(ev.data ? JSON.parse(ev.data) : null, ev);
      });
    }
    source.addEventListener('error', () => {
      if (closed) return;
      if (handlers.error) handlers.error();
      checkHealth();
      if (source.readyState === EventSource.CLOSED) {
        // refused for good: an EventSource does not tell why; a plain request does (a 401 asks for a token)
        request('operators').catch(() => {});
        clearTimeout(retry);
        retry = setTimeout(() => { if (!closed) open(); }, 3000);
      }
    });
  };
  open();
  return () => {
    closed = true;
    clearTimeout(retry);
    if (source) source.close();
  };
}
