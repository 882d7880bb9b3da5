// Florin's wallet page. Talks only to the `florin wallet serve` process that served it, with
// the session key from the link's fragment (never sent as part of a URL); renders with DOM
// text nodes only; holds no key. QR codes are made and read by the wallet process: the page
// uploads images (a file, or a frame from the camera) and shows the PNGs it gets back.
'use strict';

const KEY = 'florin-wallet-session';

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) {
    if (k === null || k === undefined) continue;
    e.append(typeof k === 'string' || typeof k === 'number' ? document.createTextNode(String(k)) : k);
  }
  return e;
}

function euros(cents) {
  if (cents === null || cents === undefined) return '—';
  return '€' + (cents / 100).toLocaleString('en', { minimumFractionDigits: 2, maximumFractionDigits: 2 });
}

function session() {
  const h = location.hash.replace(/^#/, '');
  if (/^[0-9a-f]{64}$/.test(h)) {
    sessionStorage.setItem(KEY, h);
    history.replaceState(null, '', location.pathname);
  }
  return sessionStorage.getItem(KEY) || '';
}

function say(text, ok) {
  const s = $('status');
  s.className = ok ? 'ok' : 'bad';
  s.textContent = text;
}

async function call(op, body) {
  const r = await fetch('/api/' + op, {
    method: 'POST',
    cache: 'no-store',
    headers: { 'content-type': 'application/json', 'x-florin-session': session() },
    body: JSON.stringify(body || {}),
  });
  let v = null;
  try { v = await r.json(); } catch (_) { v = null; }
  if (!r.ok || !v || v.error) {
    const e = v && v.error ? v.error : { code: 'failed', message: 'HTTP ' + r.status };
    throw Object.assign(new Error(e.message), { code: e.code });
  }
  render(v.state);
  return v.result;
}

function render(s) {
  if (!s) return;
  $('setup').hidden = !s.needs_wallet;
  $('main').hidden = !!s.needs_wallet;
  if (s.needs_wallet) {
    $('who').textContent = 'no wallet at ' + s.wallet + ' yet · node ' + s.node;
    return;
  }
  $('who').textContent = s.address + ' · ' + s.wallet + (s.encrypted ? ' (encrypted)' : ' (NOT encrypted)') + ' · node ' + s.node;
  const b = s.balance;
  $('online').textContent = euros(b.online_cents);
  $('verified').textContent = euros(b.verified_cents);
  $('offline').textContent = euros(b.offline_cents);
  $('total').textContent = euros(b.total_cents);
  const rows = [el('tr', {}, el('th', {}, 'Tokens'), el('th', {}, 'Denomination'), el('th', {}, 'Count'))];
  for (const d of b.verified) rows.push(el('tr', {}, el('td', {}, 'verified'), el('td', {}, '€' + d.denomination), el('td', {}, d.count)));
  for (const d of b.offline) rows.push(el('tr', {}, el('td', {}, 'offline'), el('td', {}, '€' + d.denomination), el('td', {}, d.count)));
  $('denominations').replaceChildren(...rows);
  const notes = [];
  if (b.withdrawing_cents > 0) notes.push(euros(b.withdrawing_cents) + ' paid to the reserve, tokens on their way (sync)');
  if (b.pending_deposit_cents > 0) notes.push(euros(b.pending_deposit_cents) + ' deposit awaiting the authority');
  if (s.in_flight) notes.push('a ' + s.in_flight + ' is in flight (sync finishes it)');
  if (s.handoffs_pending > 0) notes.push(s.handoffs_pending + ' handoff(s) to payees not delivered yet');
  if (s.open_requests.length) notes.push(s.open_requests.length + ' payment request(s) open');
  $('notes').textContent = notes.join(' · ');
  $('listening').textContent = s.listening ? 'Listening as ' + s.listening + ' (tell the payer this)' : '';
  const h = [el('tr', {}, ...['When', 'What', 'Amount', 'Status', 'With', 'Reference'].map((x) => el('th', {}, x)))];
  for (const e of s.history) {
    h.push(el('tr', {},
      el('td', {}, new Date(e.at * 1000).toLocaleString()),
      el('td', {}, e.kind),
      el('td', {}, euros(e.cents)),
      el('td', {}, e.status),
      el('td', {}, e.counterparty ? e.counterparty.slice(0, 16) + '…' : ''),
      el('td', {}, e.reference ? e.reference.slice(0, 12) + '…' : '')));
  }
  $('history').replaceChildren(...h);
}

function showQr(box, pngs, caption) {
  box.replaceChildren(el('p', { class: 'muted' }, caption),
    ...pngs.map((p, i) => el('img', { src: 'data:image/png;base64,' + p, alt: 'QR code ' + (i + 1) + ' of ' + pngs.length })));
}

function fileB64(f) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(String(r.result).replace(/^data:[^,]*,/, ''));
    r.onerror = () => reject(new Error('cannot read ' + f.name));
    r.readAsDataURL(f);
  });
}

async function files(input) {
  const list = Array.from($(input).files || []);
  if (!list.length) throw new Error('choose an image first');
  return Promise.all(list.map(fileB64));
}

function action(id, fn) {
  $(id).addEventListener('click', async () => {
    const btn = $(id);
    btn.disabled = true;
    say('working…', true);
    try {
      const msg = await fn();
      say(msg, true);
    } catch (e) {
      say((e.code ? e.code + ': ' : '') + e.message, false);
    } finally {
      btn.disabled = false;
    }
  });
}

let stream = null;

async function startCamera() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) throw new Error('this browser gives no camera here: upload an image instead');
  stream = await navigator.mediaDevices.getUserMedia({ video: { facingMode: 'environment' } });
  const v = $('video');
  v.srcObject = stream;
  v.hidden = false;
  $('snap').hidden = false;
  await v.play();
  return 'camera on: hold the request\'s code in view, then pay';
}

function frameB64() {
  const v = $('video');
  const c = $('frame');
  c.width = v.videoWidth;
  c.height = v.videoHeight;
  c.getContext('2d').drawImage(v, 0, 0);
  return c.toDataURL('image/png').replace(/^data:[^,]*,/, '');
}

function stopCamera() {
  if (stream) for (const t of stream.getTracks()) t.stop();
  stream = null;
  $('video').hidden = true;
  $('snap').hidden = true;
}

// Reads what the code asks for, asks the user, and only then has the wallet sign.
async function payConfirmed(images) {
  const q = await call('read_request', { images });
  if (!window.confirm('Pay ' + euros(q.amount_cents) + ' offline to ' + q.payee + '?')) return 'not paid';
  return payRequestResult(await call('pay_request', { images, confirm_cents: q.amount_cents, confirm_payee: q.payee }));
}

function payRequestResult(r) {
  showQr($('payment-qr'), r.qr, 'Show these ' + r.qr.length + ' code(s) to the payee (' + euros(r.amount_cents) + ', ' + r.tokens + ' tokens)');
  return 'signed ' + euros(r.amount_cents) + ' to ' + r.payee.slice(0, 16) + '…: show the code(s) to the payee';
}

// While a listener runs, the balance and history follow what it receives: one request at a
// time, stopping when the listener ends or after three failures in a row.
let polling = false;
function poll() {
  if (polling) return;
  polling = true;
  let failures = 0;
  const tick = async () => {
    try {
      const r = await fetch('/api/state', { method: 'POST', cache: 'no-store', headers: { 'content-type': 'application/json', 'x-florin-session': session() }, body: '{}' });
      const v = r.ok ? await r.json() : null;
      if (v && v.state) {
        failures = 0;
        render(v.state);
        if (!v.state.listening) { polling = false; return; }
      } else if (++failures >= 3) { polling = false; return; }
    } catch (_) {
      if (++failures >= 3) { polling = false; return; }
    }
    setTimeout(tick, 1000);
  };
  setTimeout(tick, 1000);
}

document.addEventListener('DOMContentLoaded', () => {
  session();
  call('state').then(() => { if ($('listening').textContent) poll(); })
    .catch((e) => say((e.code ? e.code + ': ' : '') + e.message, false));
  action('sync', async () => { const r = await call('sync'); return 'received ' + euros(r.received_cents) + ' on the ledger, ' + euros(r.withdrawn_cents) + ' as tokens'; });
  action('faucet-btn', async () => { const r = await call('faucet', { amount: $('faucet-amount').value }); return 'received ' + euros(r.received_cents) + ' from the faucet'; });
  action('pay', async () => {
    const r = await call('pay', { address: $('pay-address').value, amount: $('pay-amount').value });
    return 'paid ' + euros(r.amount_cents) + ' (txid ' + r.txid.slice(0, 16) + '…)';
  });
  action('withdraw', async () => { const r = await call('withdraw', { amount: $('withdraw-amount').value }); return 'withdrew ' + euros(r.withdrawn_cents) + ' into tokens'; });
  action('deposit', async () => { const r = await call('deposit', { reanchor: false }); return r.deposited ? 'deposited: ' + euros(r.credited_cents) + ' credited' : 'nothing to deposit'; });
  action('reanchor', async () => { const r = await call('deposit', { reanchor: true }); return r.deposited ? 'deposited: ' + r.reanchored + ' tokens re-anchored' : 'nothing to deposit'; });
  action('request', async () => {
    const r = await call('request', { amount: $('request-amount').value });
    showQr($('request-qr'), r.qr, 'Request for ' + euros(r.amount_cents) + ': the payer scans this');
    return 'request for ' + euros(r.amount_cents) + ' ready';
  });
  action('accept', async () => { const r = await call('accept', { images: await files('accept-file') }); return 'accepted ' + euros(r.accepted_cents) + ' offline'; });
  action('payreq', async () => payConfirmed(await files('payreq-file')));
  action('camera', startCamera);
  action('snap', async () => {
    const images = [frameB64()];
    stopCamera();
    return payConfirmed(images);
  });
  action('listen', async () => {
    const r = await call('listen');
    poll();
    return 'waiting for a payment at ' + r.peer;
  });
  action('pay-peer', async () => {
    const r = await call('pay_peer', { peer: $('peer').value, amount: $('peer-amount').value });
    const parts = [];
    if (r.resumed_cents.length) parts.push('finished ' + r.resumed_cents.length + ' interrupted payment(s)');
    for (const f of r.refused) parts.push(euros(f.amount_cents) + ' refused: ' + f.reason);
    if (r.amount_cents > 0) parts.push('paid ' + euros(r.amount_cents) + ' with ' + r.tokens + ' tokens to ' + r.payee.slice(0, 16) + '…; receipt received');
    return parts.join('; ') || 'nothing paid';
  });
  action('cancel-requests', async () => {
    const r = await call('cancel_requests');
    return 'cancelled ' + r.cancelled + ' open request(s)';
  });
  action('create', async () => {
    const none = $('no-pass').checked;
    if (!none && $('new-pass').value !== $('new-pass2').value) throw new Error('the two passphrases differ');
    const r = await call('create', { passphrase: none ? '' : $('new-pass').value, no_passphrase: none });
    $('new-pass').value = '';
    $('new-pass2').value = '';
    $('words').textContent = r.backup_words;
    return 'created: write down the 12 backup words shown under "Backup words" and keep them offline';
  });
  action('backup', async () => {
    const r = await call('backup');
    $('words').textContent = r.backup_words;
    return 'write the words down and keep them offline';
  });
});
