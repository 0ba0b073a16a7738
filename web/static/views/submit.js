// Submit: two forms. "Tune an operator" is built from GET /api/v1/operators; "Tune a model" takes a built-in model
// (GET /api/v1/models/zoo) or a torch.export .pt2 upload. The server validates; its 422 errors (detail[].loc such as
// ["body", "params", "kernel"] or ["body", "spec", "input_shapes"]) are shown beside the fields they name.

import {ApiError, getJob, getZooModels, request} from '../api.js';
import {navigate} from '../nav.js';
import {errorText, fill, h, setTitle} from '../util.js';

export async function render(main, {query}) {
  setTitle('Submit a job');
  const status = h('p', {class: 'muted', role: 'status'}, 'Loading the operator catalog…');
  main.append(h('h1', {}, 'Submit a job'), status);
  let catalog;
  let zoo;
  let from = null;
  try {
    // the model form can still take uploads without the zoo list, so its failure is the model form's to show
    [catalog, zoo] = await Promise.all([request('operators'), getZooModels().catch((e) => e)]);
    if (query.get('from')) from = await getJob(Number(query.get('from'))).catch(() => null);
  } catch (e) {
    fill(status, h('span', {class: 'error-text'}, `Could not load the operator catalog: ${errorText(e)}`));
    return null;
  }
  status.remove();
  const spec = (from && from.spec) || {};
  const operatorForm = new OperatorForm(catalog, spec.kind === 'model' ? null : spec);
  const modelForm = new ModelForm(zoo, catalog.targets, spec.kind === 'model' ? spec : null);
  const modelHeading = h('h2', {id: 'tune-model-h', tabindex: -1}, 'Tune a model');
  main.append(
    h('p', {class: 'muted'}, 'Tune one operator from the catalog, or ',
      h('a', {href: '#tune-model', id: 'jump-model', onclick: (ev) => {
        ev.preventDefault(); // the shell routes links; this one only moves within the page
        modelHeading.scrollIntoView();
        modelHeading.focus({preventScroll: true});
      }}, 'a whole model'), '.'),
    h('section', {id: 'tune-operator', 'aria-labelledby': 'tune-operator-h'},
      h('h2', {id: 'tune-operator-h'}, 'Tune an operator'), operatorForm.el),
    h('section', {id: 'tune-model', 'aria-labelledby': 'tune-model-h'}, modelHeading,
      h('p', {class: 'muted small'}, 'The server imports the model, splits it into fused subgraphs (its tasks) and ',
        'shares the budget among them; the artifact is the whole compiled model.'),
      modelForm.el));
  return null;
}

/** What both forms share: labelled rows with a slot for the server's error on each field, and sending. */
class JobForm {
  /** `prefix` keeps the two forms' element ids apart: `f-budget`, `m-budget`. */
  constructor(prefix) {
    this.prefix = prefix;
    this.errors = new Map(); // field path -> error element
    this.controls = new Map(); // field path -> control
    this.summary = h('div', {class: 'form-summary', role: 'alert'});
  }

  fieldId(path) {
    return `${this.prefix}-${path.replace(/\./g, '-')}`;
  }

  select(name, options, value) {
    const el = h('select', {id: this.fieldId(name), name}, options.map((o) => h('option', {value: o}, o)));
    el.value = value;
    return el;
  }

  number(path, {min, max, value, required = true}) {
    return h('input', {type: 'number', inputmode: 'numeric', step: 1, id: this.fieldId(path), name: path, min, max,
      value: value ?? '', required, 'aria-required': required ? 'true' : null});
  }

  /** A label, the control, help text and the slot for the server's error on this field. */
  row(path, label, control, ...help) {
    const error = h('p', {class: 'field-error', id: `${this.fieldId(path)}-error`, dataset: {errorFor: path},
      hidden: true});
    this.errors.set(path, error);
    this.controls.set(path, control);
    const described = [control.getAttribute('aria-describedby'), error.id].filter(Boolean).join(' ');
    control.setAttribute('aria-describedby', described);
    return h('div', {class: 'field'}, h('label', {for: control.id}, label), control, ...help, error);
  }

  /** The field path an error's `loc` names, without the leading "body". */
  pathOf(loc) {
    return loc.filter((part, i) => !(i === 0 && part === 'body')).join('.');
  }

  clearErrors() {
    for (const el of this.errors.values()) {
      el.hidden = true;
      el.textContent = '';
    }
    for (const input of this.el.querySelectorAll('[aria-invalid]')) input.removeAttribute('aria-invalid');
    fill(this.summary);
  }

  showErrors(detail, lead = 'The server did not accept this job. ') {
    const unplaced = [];
    let first = null;
    const items = Array.isArray(detail) ? detail : [{loc: [], msg: String(detail)}];
    for (const item of items) {
      const named = this.pathOf(item.loc || []);
      let path = named;
      // a missing required parameter may come back as "params" plus the name in the message
      while (path && !this.errors.has(path)) path = path.split('.').slice(0, -1).join('.');
      const el = path ? this.errors.get(path) : null;
      const message = item.msg || String(item);
      if (!el || el.closest('[hidden]:not(.field-error)')) { // no field, or one not shown for this choice
        unplaced.push(`${named || 'request'}: ${message}`);
        continue;
      }
      el.hidden = false;
      el.textContent = el.textContent ? `${el.textContent}; ${message}` : message;
      const control = this.controls.get(path);
      control.setAttribute('aria-invalid', 'true');
      first = first || control;
    }
    fill(this.summary, h('p', {class: 'error-box'},
      lead, first ? 'See the marked fields. ' : '',
      unplaced.length ? h('span', {class: 'unplaced'}, unplaced.join('; ')) : null));
    (first || this.summary).focus?.();
  }

  /** Runs `send` (a request answering the new job) and opens the job's page; shows why not otherwise. */
  async post(button, busy, send) {
    this.clearErrors();
    const label = button.textContent;
    button.disabled = true;
    button.textContent = busy;
    try {
      const job = await send();
      navigate(`/jobs/${job.id}`);
    } catch (e) {
      if (e instanceof ApiError && e.status === 422) this.showErrors(e.detail);
      else fill(this.summary, h('p', {class: 'error-box'}, `Could not submit: ${errorText(e)}`));
    } finally {
      button.disabled = false;
      button.textContent = label;
    }
  }
}

/** One operator from the catalog, its parameters generated from the catalog's limits. */
class OperatorForm extends JobForm {
  constructor(catalog, spec) {
    super('f');
    this.catalog = catalog;
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
    this.submit = h('button', {type: 'submit', class: 'primary', id: 'submit-job'}, 'Submit');

    this.el = h('form', {class: 'submit-form', novalidate: true, id: 'submit-form'},
      this.summary,
      this.row('operator', 'Operator', this.operator, this.operatorHelp),
      this.params,
      h('fieldset', {}, h('legend', {}, 'Program'),
        this.row('dtype', 'Element type', this.dtype),
        this.row('epilogue', 'Fused epilogue', this.epilogue,
          h('p', {class: 'muted small'}, 'element-wise stages after the operator: bias add, relu; requantize (int8 ' +
            'only): the int32 sums to uint8, with a scale and a zero point per output channel'))),
      h('fieldset', {}, h('legend', {}, 'Search'),
        this.row('target', 'Target', this.target,
          h('p', {class: 'muted small'}, 'host: this server\'s CPU, detected; cuda: its GPU')),
        this.row('budget', 'Budget', this.budget, h('p', {class: 'muted small'}, 'number of on-device measurements')),
        this.row('seed', 'Seed', this.seed)),
      h('div', {class: 'form-actions'}, this.submit));
    this.el.addEventListener('submit', (ev) => {
      ev.preventDefault();
      this.post(this.submit, 'Submitting…', () => request('jobs', {method: 'POST', body: this.body()}));
    });
    this.renderParams();
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
    for (const key of [...this.errors.keys()]) {
      if (!key.startsWith('params.')) continue;
      this.errors.delete(key);
      this.controls.delete(key);
    }
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
    return {kind: 'operator', operator: this.operator.value, params, dtype: this.dtype.value,
      epilogue: this.epilogue.value, target: this.target.value, budget: int(this.budget), seed: int(this.seed)};
  }
}

/** An integer field's value as a number when it is one; anything else goes as typed, for the server to name. */
const int = (el) => (/^-?\d+$/.test(el.value.trim()) ? Number(el.value) : el.value);

const fmtShapes = (shapes) => shapes.map((s) => s.join('×')).join(', ');

/**
 * A whole model: a built-in one (POST /api/v1/models/zoo, JSON) or a .pt2 upload (POST /api/v1/models, multipart
 * `file` + `spec` JSON). `zoo` is the zoo listing, or the error that kept it from loading.
 */
class ModelForm extends JobForm {
  constructor(zoo, targets, spec) {
    super('m');
    const models = zoo instanceof Error ? [] : zoo.data;
    const upload = !models.length || (spec && spec.source === 'upload');

    this.zooRadio = h('input', {type: 'radio', name: 'source', value: 'zoo', id: 'm-source-zoo', checked: !upload,
      disabled: !models.length});
    this.uploadRadio = h('input', {type: 'radio', name: 'source', value: 'upload', id: 'm-source-upload',
      checked: upload});
    this.models = models;
    this.model = this.select('model', models.map((m) => m.name),
      spec && spec.model && models.some((m) => m.name === spec.model) ? spec.model : (models[0] || {}).name);
    this.modelHelp = h('p', {class: 'muted small', id: 'm-model-help'});
    this.model.setAttribute('aria-describedby', this.modelHelp.id);
    this.model.addEventListener('change', () => this.describeModel());
    this.file = h('input', {type: 'file', id: 'm-file', name: 'file', accept: '.pt2'});
    this.shapes = h('input', {type: 'text', id: 'm-input_shapes', name: 'input_shapes', spellcheck: 'false',
      autocomplete: 'off', placeholder: '[[1, 3, 224, 224]]',
      value: spec && spec.source === 'upload' && spec.input_shapes ? JSON.stringify(spec.input_shapes) : ''});
    this.name = h('input', {type: 'text', id: 'm-name', name: 'name', maxlength: 64, autocomplete: 'off',
      value: (spec && spec.name) || ''});
    this.target = this.select('target', targets, (spec && spec.target) || targets[0]);
    this.layout = this.select('layout', ['blocked', 'none'], (spec && spec.layout) || 'blocked');
    this.budget = this.number('budget', {min: 1, value: (spec && spec.budget) || 64});
    this.seed = this.number('seed', {min: 0, value: (spec && spec.seed) || 0});
    this.submit = h('button', {type: 'submit', class: 'primary', id: 'submit-model'}, 'Tune model');

    this.zooRows = h('div', {class: 'source-rows'},
      this.row('model', 'Built-in model', this.model, this.modelHelp,
        zoo instanceof Error ? h('p', {class: 'error-text'}, `Could not load the built-in models: ${errorText(zoo)}`)
          : null));
    this.uploadRows = h('div', {class: 'source-rows'},
      this.row('file', 'Model file (.pt2)', this.file,
        h('p', {class: 'muted small'}, 'saved with torch.export.save; the server checks it before answering'),
        spec && spec.source === 'upload' ? h('p', {class: 'muted small'}, 'choose the file again to tune it again')
          : null),
      this.row('input_shapes', 'Input shapes (optional)', this.shapes,
        h('p', {class: 'muted small'}, 'JSON, one shape per input in call order; ',
          'default: the shapes the program was exported with')));

    this.el = h('form', {class: 'submit-form', novalidate: true, id: 'model-form'},
      this.summary,
      h('fieldset', {class: 'source-choice'}, h('legend', {}, 'Model'),
        h('div', {class: 'choices'},
          h('label', {class: 'check', for: 'm-source-zoo'}, this.zooRadio, 'Built-in model'),
          h('label', {class: 'check', for: 'm-source-upload'}, this.uploadRadio, 'Upload a .pt2 file')),
        this.zooRows, this.uploadRows,
        this.row('name', 'Job name (optional)', this.name,
          h('p', {class: 'muted small'}, 'default: the model\'s name, or the file\'s'))),
      h('fieldset', {}, h('legend', {}, 'Search'),
        this.row('target', 'Target', this.target,
          h('p', {class: 'muted small'}, 'host: this server\'s CPU, detected; cuda: its GPU')),
        this.row('layout', 'Layouts', this.layout,
          h('p', {class: 'muted small'}, 'blocked: convolutions in N C/c H W c, carried through the graph, ',
            'weights packed at build time; none: the model\'s own (NCHW)')),
        this.row('budget', 'Budget', this.budget,
          h('p', {class: 'muted small'}, 'on-device measurements for the whole model, shared by its tasks')),
        this.row('seed', 'Seed', this.seed)),
      h('div', {class: 'form-actions'}, this.submit));
    for (const radio of [this.zooRadio, this.uploadRadio]) radio.addEventListener('change', () => this.showSource());
    this.el.addEventListener('submit', (ev) => {
      ev.preventDefault();
      this.send();
    });
    this.describeModel();
    this.showSource();
  }

  source() {
    return this.uploadRadio.checked ? 'upload' : 'zoo';
  }

  showSource() {
    this.zooRows.hidden = this.source() !== 'zoo';
    this.uploadRows.hidden = this.source() !== 'upload';
  }

  describeModel() {
    const m = this.models.find((x) => x.name === this.model.value);
    fill(this.modelHelp, m ? `${m.description}; input ${fmtShapes(m.input_shapes)}` : '');
  }

  /** Both endpoints blame spec fields as "spec.<field>" (uploads) or "<field>" (zoo JSON): one slot for each. */
  pathOf(loc) {
    const path = super.pathOf(loc);
    return path.startsWith('spec.') ? path.slice('spec.'.length) : path;
  }

  send() {
    this.clearErrors();
    const spec = {target: this.target.value, layout: this.layout.value, budget: int(this.budget),
      seed: int(this.seed)};
    if (this.name.value.trim()) spec.name = this.name.value.trim();
    if (this.source() === 'zoo') {
      this.post(this.submit, 'Importing the model…',
        () => request('models/zoo', {method: 'POST', body: {model: this.model.value, ...spec}}));
      return;
    }
    const shapes = this.shapes.value.trim();
    if (shapes) {
      try {
        spec.input_shapes = JSON.parse(shapes);
      } catch {
        this.showErrors([{loc: ['input_shapes'], msg: 'not JSON: write the shapes like [[1, 3, 224, 224]]'}],
          'Check this job before sending it. ');
        return;
      }
    }
    const form = new FormData();
    if (this.file.files.length) form.append('file', this.file.files[0]);
    form.append('spec', JSON.stringify(spec));
    this.post(this.submit, 'Uploading…', () => request('models', {method: 'POST', body: form}));
  }
}
