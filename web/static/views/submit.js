// Submit: a form built from GET /api/v1/operators. The server validates; its 422 errors (detail[].loc such as
// ["body", "params", "kernel"]) are shown beside the fields they name.

import {ApiError, getJob, request} from '../api.js';
import {navigate} from '../nav.js';
import {errorText, fill, h, setTitle} from '../util.js';

export async function render(main, {query}) {
  setTitle('Submit a job');
  const status = h('p', {class: 'muted', role: 'status'}, 'Loading the operator catalog…');
  main.append(h('h1', {}, 'Submit a job'), status);
  let catalog;
  let from = null;
  try {
    catalog = await request('operators');
    if (query.get('from')) from = await getJob(Number(query.get('from'))).catch(() => null);
  } catch (e) {
    fill(status, h('span', {class: 'error-text'}, `Could not load the operator catalog: ${errorText(e)}`));
    return null;
  }
  status.remove();
  const form = new SubmitForm(catalog, from && from.spec);
  main.append(form.el);
  return null;
}

const fieldId = (path) => `f-${path.replace(/\./g, '-')}`;

class SubmitForm {
  constructor(catalog, spec) {
    this.catalog = catalog;
    this.errors = new Map(); // field path -> error element
    this.values = {...((spec && spec.params) || {})}; // kept across operator changes for same-named params

    this.operator = this.select('operator', catalog.data.map((op) => op.name),
      spec && spec.operator ? spec.operator : catalog.data[0].name);
    this.operatorHelp = h('p', {class: 'muted small', id: 'operator-help'});
    this.operator.setAttribute('aria-describedby', 'operator-help');
    this.operator.addEventListener('change', () => {
      this.remember();
      this.renderParams();
    });
    this.params = h('fieldset', {class: 'params'});
    this.dtype = this.select('dtype', catalog.dtypes, (spec && spec.dtype) || catalog.dtypes[0]);
    this.epilogue = this.select('epilogue', catalog.epilogues, (spec && spec.epilogue) || 'none');
    this.target = this.select('target', catalog.targets, (spec && spec.target) || catalog.targets[0]);
    this.budget = this.number('budget', {min: 1, value: (spec && spec.budget) || 64});
    this.seed = this.number('seed', {min: 0, value: (spec && spec.seed) || 0});
    this.summary = h('div', {class: 'form-summary', role: 'alert'});
    this.submit = h('button', {type: 'submit', class: 'primary', id: 'submit-job'}, 'Submit');

    this.el = h('form', {class: 'submit-form', novalidate: true, id: 'submit-form'},
      this.summary,
      this.row('operator', 'Operator', this.operator, this.operatorHelp),
      this.params,
      h('fieldset', {}, h('legend', {}, 'Program'),
        this.row('dtype', 'Element type', this.dtype),
        this.row('epilogue', 'Fused epilogue', this.epilogue,
          h('p', {class: 'muted small'}, 'element-wise stages after the operator: bias add, relu'))),
      h('fieldset', {}, h('legend', {}, 'Search'),
        this.row('target', 'Target', this.target,
          h('p', {class: 'muted small'}, 'host: this server\'s CPU, detected; cuda: its GPU')),
        this.row('budget', 'Budget', this.budget, h('p', {class: 'muted small'}, 'number of on-device measurements')),
        this.row('seed', 'Seed', this.seed)),
      h('div', {class: 'form-actions'}, this.submit));
    this.el.addEventListener('submit', (ev) => {
      ev.preventDefault();
      this.send();
    });
    this.renderParams();
  }

  select(name, options, value) {
    const el = h('select', {id: fieldId(name), name}, options.map((o) => h('option', {value: o}, o)));
    el.value = value;
    return el;
  }

  number(path, {min, max, value, required = true}) {
    return h('input', {type: 'number', inputmode: 'numeric', step: 1, id: fieldId(path), name: path, min, max,
      value: value ?? '', required, 'aria-required': required ? 'true' : null});
  }

  /** A label, the control, help text and the slot for the server's error on this field. */
  row(path, label, control, ...help) {
    const error = h('p', {class: 'field-error', id: `${fieldId(path)}-error`, dataset: {errorFor: path}, hidden: true});
    this.errors.set(path, error);
    const described = [control.getAttribute('aria-describedby'), error.id].filter(Boolean).join(' ');
    control.setAttribute('aria-describedby', described);
    return h('div', {class: 'field'}, h('label', {for: control.id}, label), control, ...help, error);
  }

  op() {
    return this.catalog.data.find((o) => o.name === this.operator.value);
  }

  remember() {
    for (const input of this.params.querySelectorAll('input')) this.values[input.dataset.param] = input.value;
  }

  renderParams() {
    const op = this.op();
    fill(this.operatorHelp, op.description);
    for (const key of [...this.errors.keys()]) if (key.startsWith('params.')) this.errors.delete(key);
    const rows = op.params.map((p) => {
      const input = this.number(`params.${p.name}`, {min: p.minimum, max: p.maximum, required: p.required,
        value: this.values[p.name] ?? p.default ?? ''});
      input.dataset.param = p.name;
      const limits = `${p.minimum}–${p.maximum}${p.required ? ', required' : `, default ${p.default}`}`;
      return this.row(`params.${p.name}`, p.name, input,
        h('p', {class: 'muted small'}, `${p.description} (${limits})`));
    });
    fill(this.params, h('legend', {}, `Parameters of ${op.name}`), h('div', {class: 'param-grid'}, rows));
  }

  body() {
    const params = {};
    for (const input of this.params.querySelectorAll('input')) {
      const raw = input.value.trim();
      if (raw === '') continue; // optional: the server fills the default; required: the server says so
      params[input.dataset.param] = /^-?\d+$/.test(raw) ? Number(raw) : raw;
    }
    const int = (el) => (/^-?\d+$/.test(el.value.trim()) ? Number(el.value) : el.value);
    return {kind: 'operator', operator: this.operator.value, params, dtype: this.dtype.value,
      epilogue: this.epilogue.value, target: this.target.value, budget: int(this.budget), seed: int(this.seed)};
  }

  clearErrors() {
    for (const el of this.errors.values()) {
      el.hidden = true;
      el.textContent = '';
    }
    for (const input of this.el.querySelectorAll('[aria-invalid]')) input.removeAttribute('aria-invalid');
    fill(this.summary);
  }

  showErrors(detail) {
    const unplaced = [];
    let first = null;
    const items = Array.isArray(detail) ? detail : [{loc: [], msg: String(detail)}];
    for (const item of items) {
      const loc = (item.loc || []).filter((part, i) => !(i === 0 && part === 'body'));
      let path = loc.join('.');
      // a missing required parameter may come back as "params" plus the name in the message
      while (path && !this.errors.has(path)) path = path.split('.').slice(0, -1).join('.');
      const el = path ? this.errors.get(path) : null;
      const message = item.msg || String(item);
      if (!el) {
        unplaced.push(`${loc.join('.') || 'request'}: ${message}`);
        continue;
      }
      el.hidden = false;
      el.textContent = el.textContent ? `${el.textContent}; ${message}` : message;
      const control = document.getElementById(fieldId(path));
      if (control) {
        control.setAttribute('aria-invalid', 'true');
        first = first || control;
      }
    }
    fill(this.summary, h('p', {class: 'error-box'},
      'The server did not accept this job. ', first ? 'See the marked fields. ' : '',
      unplaced.length ? h('span', {class: 'unplaced'}, unplaced.join('; ')) : null));
    (first || this.summary).focus?.();
  }

  async send() {
    this.clearErrors();
    this.submit.disabled = true;
    this.submit.textContent = 'Submitting…';
    try {
      const job = await request('jobs', {method: 'POST', body: this.body()});
      navigate(`/jobs/${job.id}`);
    } catch (e) {
      if (e instanceof ApiError && e.status === 422) this.showErrors(e.detail);
      else fill(this.summary, h('p', {class: 'error-box'}, `Could not submit: ${errorText(e)}`));
    } finally {
      this.submit.disabled = false;
      this.submit.textContent = 'Submit';
    }
  }
}
