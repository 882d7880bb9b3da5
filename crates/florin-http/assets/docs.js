// Florin's API viewer: renders /openapi.json with DOM text nodes only (no HTML from the
// document is ever interpreted), no third-party code, nothing fetched but from this node.
'use strict';

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v; else e.setAttribute(k, v);
  }
  for (const k of kids) {
    if (k === null || k === undefined) continue;
    e.append(typeof k === 'string' ? document.createTextNode(k) : k);
  }
  return e;
}

let doc = null;

function resolve(ref) {
  let at = doc;
  for (const part of ref.replace(/^#\//, '').split('/')) at = at ? at[part] : undefined;
  return at;
}

function typeName(s) {
  if (!s) return 'any';
  if (s.$ref) return s.$ref.split('/').pop();
  if (s.oneOf) return s.oneOf.map(typeName).join(' | ');
  if (s.allOf) return s.allOf.map(typeName).join(' & ');
  const t = Array.isArray(s.type) ? s.type.join(' | ') : (s.type || 'any');
  if (t === 'array') return typeName(s.items) + '[]';
  return t + (s.format ? ' (' + s.format + ')' : '') + (s.pattern ? ' ' + s.pattern : '');
}

// A schema as nested fields; a named schema once per branch (no loops).
function schemaView(s, seen) {
  seen = seen || new Set();
  if (!s) return el('span', { class: 'type' }, 'any');
  if (s.$ref) {
    const name = s.$ref.split('/').pop();
    if (seen.has(name)) return el('span', { class: 'type' }, name);
    const inner = resolve(s.$ref);
    const d = el('details', {}, el('summary', {}, el('span', { class: 'type' }, name),
      inner && inner.description ? el('span', { class: 'desc' }, ' — ' + inner.description) : null));
    d.append(schemaView(inner, new Set([...seen, name])));
    return d;
  }
  if (s.allOf || s.oneOf) {
    const box = el('div', {});
    for (const part of (s.allOf || s.oneOf)) {
      if (part.type === 'null') { box.append(el('div', { class: 'desc' }, 'or null')); continue; }
      box.append(schemaView(part, seen));
    }
    return box;
  }
  if (s.type === 'array' || (Array.isArray(s.type) && s.type.includes('array'))) {
    return el('div', {}, el('span', { class: 'type' }, 'array of '), schemaView(s.items, seen));
  }
  if (s.properties) {
    const box = el('div', { class: 'schema' });
    const required = new Set(s.required || []);
    for (const [name, p] of Object.entries(s.properties)) {
      const line = el('div', { class: 'field' }, el('code', {}, name), ': ',
        el('span', { class: 'type' }, typeName(p)),
        required.has(name) ? el('span', { class: 'req' }, ' required') : null,
        p.description ? el('span', { class: 'desc' }, ' — ' + p.description) : null);
      box.append(line);
      if (p.$ref || p.properties || p.items || p.allOf || p.oneOf) {
        const nested = schemaView(p.items && !p.$ref ? p.items : p, seen);
        nested.classList && nested.classList.add('field');
        box.append(nested);
      }
    }
    return box;
  }
  return el('span', { class: 'type' }, typeName(s));
}

function contentView(content) {
  const box = el('div', {});
  for (const [type, c] of Object.entries(content || {})) {
    box.append(el('div', {}, el('code', {}, type)), schemaView(c.schema));
  }
  return box;
}

function operationView(path, method, op) {
  const secured = (op.security || []).some((s) => Object.keys(s).length > 0);
  const body = el('div', { class: 'body' });
  if (op.description) body.append(el('p', {}, op.description));
  if (secured) {
    const names = op.security.flatMap((s) => Object.keys(s));
    const optional = op.security.some((s) => Object.keys(s).length === 0);
    body.append(el('p', { class: 'lock' }, (optional ? 'May need' : 'Needs') + ' credential: ' + names.join(', ')));
  }
  if (op.parameters && op.parameters.length) {
    const t = el('table', {}, el('tr', {}, el('th', {}, 'Parameter'), el('th', {}, 'In'),
      el('th', {}, 'Type'), el('th', {}, 'Description')));
    for (const p of op.parameters) {
      t.append(el('tr', {}, el('td', {}, el('code', {}, p.name), p.required ? el('span', { class: 'req' }, ' required') : null),
        el('td', {}, p.in), el('td', {}, el('span', { class: 'type' }, typeName(p.schema))), el('td', {}, p.description || '')));
    }
    body.append(el('h3', {}, 'Parameters'), t);
  }
  if (op.requestBody) {
    body.append(el('h3', {}, 'Request body'));
    if (op.requestBody.description) body.append(el('p', { class: 'desc' }, op.requestBody.description));
    body.append(contentView(op.requestBody.content));
  }
  body.append(el('h3', {}, 'Responses'));
  const t = el('table', {});
  for (const [code, r0] of Object.entries(op.responses || {})) {
    const r = r0.$ref ? resolve(r0.$ref) : r0;
    t.append(el('tr', {}, el('td', {}, el('code', {}, code)),
      el('td', {}, r ? r.description : '', r && r.content ? contentView(r.content) : null)));
  }
  body.append(t);
  const d = el('details', { class: 'op', 'data-route': (method + ' ' + path + ' ' + (op.summary || '')).toLowerCase() },
    el('summary', {}, el('span', { class: 'method ' + method }, method), el('span', { class: 'path' }, path),
      el('span', { class: 'summary' }, op.summary || ''), secured ? el('span', { class: 'lock' }, '[' + op.security.flatMap((x) => Object.keys(x)).join(', ') + ']') : null),
    body);
  d.id = op.operationId || (method + path);
  return d;
}

function render() {
  document.getElementById('title').textContent = doc.info.title + ' ' + doc.info.version;
  document.getElementById('about').textContent = doc.info.description || '';
  document.title = doc.info.title;
  const byTag = new Map();
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const method of ['get', 'post', 'put', 'delete', 'patch']) {
      const op = item[method];
      if (!op) continue;
      const tag = (op.tags && op.tags[0]) || 'other';
      if (!byTag.has(tag)) byTag.set(tag, []);
      byTag.get(tag).push(operationView(path, method, op));
    }
  }
  const ops = document.getElementById('ops');
  const nav = document.getElementById('tags');
  ops.replaceChildren();
  for (const [tag, views] of byTag) {
    nav.append(el('a', { href: '#tag-' + tag }, tag + ' (' + views.length + ')'));
    ops.append(el('h2', { id: 'tag-' + tag }, tag), ...views);
  }
  const schemas = el('div', {});
  for (const name of Object.keys((doc.components && doc.components.schemas) || {}).sort()) {
    schemas.append(schemaView({ $ref: '#/components/schemas/' + name }));
  }
  nav.append(el('a', { href: '#schemas' }, 'schemas'));
  ops.append(el('h2', { id: 'schemas' }, 'schemas'), schemas);
}

document.addEventListener('DOMContentLoaded', async () => {
  document.getElementById('filter').addEventListener('input', (ev) => {
    const q = ev.target.value.toLowerCase();
    for (const d of document.querySelectorAll('details.op')) {
      d.hidden = q !== '' && !d.dataset.route.includes(q);
    }
  });
  try {
    const r = await fetch('/openapi.json');
    if (!r.ok) throw new Error('HTTP ' + r.status);
    doc = await r.json();
    render();
  } catch (e) {
    document.getElementById('status').textContent = 'Could not load /openapi.json: ' + e.message;
  }
});
