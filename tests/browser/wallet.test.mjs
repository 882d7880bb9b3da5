// The local web wallet (`florin wallet serve`) in a real browser (Debian's Chromium driven by
// playwright-core) against a real devnet over TLS: create an encrypted wallet, fund it from the
// faucet, pay a second wallet, pay a request shown as a QR image and accept a payment shown as
// QR images, withdraw and deposit, read the backup words; balances checked through the CLI
// afterwards, beside the running page; requests without the session key or from another Host
// refused. Run by scripts/browser-test.sh (FLORIN_BIN, OUT_DIR, PLAYWRIGHT_CORE, CHROMIUM).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import http from 'node:http';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, BIN, OUT, florinAt, startDevnet, stop } from './helpers.mjs';

const PASS = 'a long and private passphrase';
const dir = mkdtempSync(join(tmpdir(), 'florin-web-wallet-'));
const data = join(dir, 'devnet');
let devnet;
let url;
let serve;
let pageUrl;
let browser;
let page;
let bobListen;
const problems = [];
const confirmed = [];

const florin = (env, ...args) => florinAt(dir, url, join(data, 'tls', 'ca.pem'), env, ...args);
const web = (...args) => florin({ FLORIN_WALLET_PASSPHRASE: PASS }, 'wallet', '--wallet', 'web.json', '--json', ...args);
const bob = (...args) => florin({}, 'wallet', '--wallet', 'bob.json', '--json', ...args);

/// Resolves to the status of a raw HTTP request to the wallet page (any headers, Host included).
function raw(path, headers) {
  const u = new URL(pageUrl);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, path, method: 'POST', headers }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode));
    });
    req.on('error', reject);
    req.end('{}');
  });
}

async function click(id) {
  await page.click('#' + id);
  await page.waitForFunction(() => document.getElementById('status').textContent !== 'working…', null, { timeout: 60_000 });
  const status = await page.textContent('#status');
  const cls = await page.getAttribute('#status', 'class');
  return { ok: cls === 'ok', status };
}

async function mustClick(id) {
  const r = await click(id);
  assert.ok(r.ok, id + ': ' + r.status);
  return r.status;
}

/// Saves the QR images shown in `box` as PNG files named `stem-N.png`; their paths.
async function saveQr(box, stem) {
  const srcs = await page.$$eval('#' + box + ' img', (imgs) => imgs.map((i) => i.getAttribute('src')));
  assert.ok(srcs.length > 0, 'QR codes shown in ' + box);
  return srcs.map((s, i) => {
    const f = join(dir, `${stem}-${i + 1}.png`);
    writeFileSync(f, Buffer.from(s.replace(/^data:image\/png;base64,/, ''), 'base64'));
    return f;
  });
}

const cents = async (id) => Math.round(parseFloat((await page.textContent('#' + id)).replace(/[€,]/g, '')) * 100);

before(async () => {
  ({ proc: devnet, url } = await startDevnet(data, []));
  // The web wallet is created in the page (below); bob with the CLI.
  bob('new', '--no-passphrase');
  serve = spawn(BIN, ['wallet', '--wallet', 'web.json', '--json', 'serve', '--listen', '127.0.0.1:0'], {
    cwd: dir,
    env: { ...process.env, FLORIN_NODE: url, FLORIN_CA_CERT: join(data, 'tls', 'ca.pem') },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let err = '';
  serve.stderr.on('data', (d) => { err += d; });
  pageUrl = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('serve did not start: ' + err)), 60_000);
    serve.stdout.on('data', (d) => {
      out += d;
      const m = /"url":\s*"([^"]+)"/.exec(out);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    serve.on('exit', (c) => { clearTimeout(timer); reject(new Error('serve exited ' + c + ': ' + err)); });
  });
  browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ['--no-sandbox'] });
  const context = await browser.newContext({ viewport: { width: 1280, height: 1500 } });
  page = await context.newPage();
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  page.on('response', (r) => { if (r.status() >= 500) problems.push(r.status() + ' ' + r.url()); });
  // Paying a request asks the user first (amount and payee): the test reads and accepts.
  page.on('dialog', (d) => {
    confirmed.push(d.message());
    d.accept();
  });
  page.on('request', (r) => {
    const u = new URL(r.url());
    if (u.origin !== new URL(pageUrl).origin && !u.protocol.startsWith('data')) problems.push('request elsewhere: ' + r.url());
  });
});

after(async () => {
  if (bobListen) await stop(bobListen);
  if (browser) await browser.close();
  await stop(serve);
  await stop(devnet);
  rmSync(dir, { recursive: true, force: true });
});

test('the web wallet funds, pays, requests and pays by QR, withdraws and deposits', async () => {
  await page.goto(pageUrl);
  // No wallet yet: the page creates it, encrypted under the passphrase typed there.
  await page.waitForSelector('#setup:not([hidden])');
  await page.fill('#new-pass', 'short');
  await page.fill('#new-pass2', 'short');
  const weak = await click('create');
  assert.ok(!weak.ok && /8 characters/.test(weak.status), weak.status);
  await page.fill('#new-pass', PASS);
  await page.fill('#new-pass2', PASS);
  await mustClick('create');
  const shownWords = (await page.textContent('#words')).trim().split(/\s+/);
  assert.equal(shownWords.length, 12);
  assert.ok(await page.isHidden('#setup'));
  const address = web('address').address;
  assert.equal(web('address').verified, true, 'the CLI opens the page-made file with the same passphrase');
  await page.waitForFunction((a) => document.getElementById('who').textContent.startsWith(a), address);
  assert.equal(new URL(page.url()).hash, '', 'the session key leaves the address bar');

  // Fund from the devnet's faucet.
  await page.fill('#faucet-amount', '50');
  await mustClick('faucet-btn');
  assert.equal(await cents('online'), 5000);

  // Pay a second wallet on the ledger; it collects the handoff through the CLI.
  const bobAddress = bob('address').address;
  await page.fill('#pay-address', bobAddress);
  await page.fill('#pay-amount', '12.34');
  await mustClick('pay');
  assert.equal(await cents('online'), 5000 - 1234);
  assert.equal(bob('sync').received_cents, 1234);

  // Withdraw into tokens.
  await page.fill('#withdraw-amount', '20');
  await mustClick('withdraw');
  assert.equal(await cents('verified'), 2000);

  // Pay bob's request shown as a QR image (uploaded), and bob accepts the QR images shown.
  bob('withdraw', '10');
  bob('offline', 'request', '3', '--qr', 'bob-req.png');
  await page.setInputFiles('#payreq-file', join(dir, 'bob-req.png'));
  await mustClick('payreq');
  assert.ok(confirmed.some((m) => m.includes('€3.00') && m.includes(bobAddress)), confirmed.join(' | '));
  const payImages = await saveQr('payment-qr', 'to-bob');
  const accepted = bob('offline', 'accept', '--qr', ...payImages);
  assert.equal(accepted.accepted_cents, 300, JSON.stringify(accepted));
  assert.equal(await cents('verified'), 1700);
  await page.screenshot({ path: join(OUT, 'wallet-paid-by-qr.png'), fullPage: true });

  // Request a payment: the page shows a QR code; bob pays it from the image; the page accepts
  // bob's payment from his QR images.
  await page.fill('#request-amount', '5');
  await mustClick('request');
  const [reqImage] = await saveQr('request-qr', 'web-req');
  bob('offline', 'pay', reqImage, '--qr', join(dir, 'bob-pay.png'));
  const bobPay = readdirSync(dir).filter((f) => /^bob-pay(-\d+)?\.png$/.test(f)).sort().map((f) => join(dir, f));
  await page.setInputFiles('#accept-file', bobPay);
  await mustClick('accept');
  assert.equal(await cents('offline'), 500);

  // Deposit the offline tokens: credited on the ledger.
  const before = await cents('online');
  await mustClick('deposit');
  assert.equal(await cents('offline'), 0);
  assert.equal(await cents('online'), before + 500);

  // Nearby wallets over the device channel: the page listens and bob pays it (a second click
  // shows the same listener); then bob listens and the page pays him.
  await mustClick('listen');
  const listening = (await page.textContent('#listening')).match(/as (\S+)/)[1];
  assert.ok(listening.startsWith(address + '@127.0.0.1:'), listening);
  assert.match(await mustClick('listen'), /waiting for a payment at/);
  assert.equal((await page.textContent('#listening')).match(/as (\S+)/)[1], listening);
  const paidPeer = bob('offline', 'pay', '1.50', '--peer', listening);
  assert.equal(paidPeer.amount_cents, 150, JSON.stringify(paidPeer));
  await page.waitForFunction(() => document.getElementById('offline').textContent === '€1.50', null, { timeout: 60_000 });
  await page.waitForFunction(() => document.getElementById('listening').textContent === '', null, { timeout: 90_000 });
  // A payee given only as HOST:PORT is refused (the page cannot confirm an unpinned key).
  await page.fill('#peer', '127.0.0.1:9');
  await page.fill('#peer-amount', '1');
  const unpinned = await click('pay-peer');
  assert.ok(!unpinned.ok && /address/.test(unpinned.status), unpinned.status);
  bobListen = spawn(BIN, ['wallet', '--wallet', 'bob.json', '--json', 'offline', 'listen', '--listen', '127.0.0.1:0', '--count', '1', '--no-announce'], {
    cwd: dir,
    env: { ...process.env, FLORIN_NODE: url, FLORIN_CA_CERT: join(data, 'tls', 'ca.pem') },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const bobDone = new Promise((r) => bobListen.once('exit', r));
  let bobOut = '';
  const bobOfflineBefore = bob('balance').offline_cents;
  const bobAt = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('bob did not listen')), 60_000);
    bobListen.stdout.on('data', (d) => {
      bobOut += d;
      const out = bobOut;
      const m = /"at":\s*"([^"]+)"/.exec(out);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
  });
  const verifiedBefore = await cents('verified');
  await page.fill('#peer', bobAddress + '@' + bobAt);
  await page.fill('#peer-amount', '2');
  await mustClick('pay-peer');
  assert.equal(await cents('verified'), verifiedBefore - 200);
  assert.equal(await bobDone, 0, 'bob took one payment and ended');
  assert.equal(bob('balance').offline_cents, bobOfflineBefore + 200, 'bob holds what the page paid: ' + bobOut);

  // The backup words, on request.
  await mustClick('backup');
  const words = (await page.textContent('#words')).trim().split(/\s+/);
  assert.equal(words.length, 12);
  assert.deepEqual(words.join(' '), web('backup').backup_words);

  // History: every operation, with its status.
  const kinds = await page.$$eval('#history td:nth-child(2)', (tds) => tds.map((t) => t.textContent));
  for (const k of ['faucet', 'pay', 'withdraw', 'offline_pay', 'offline_receive', 'deposit']) assert.ok(kinds.includes(k), k + ' in ' + kinds);
  assert.ok(kinds.filter((k) => k === 'offline_receive').length >= 2, 'the peer payment is in the history: ' + kinds);
  await page.screenshot({ path: join(OUT, 'wallet.png'), fullPage: true });

  // The CLI, beside the running page, sees the same wallet.
  const b = web('balance');
  assert.equal(b.online_cents, await cents('online'));
  assert.equal(b.verified_cents, await cents('verified'));
  assert.equal(b.total_cents, await cents('total'));

  // A failed operation is told, and changes nothing.
  await page.fill('#pay-address', 'not-an-address');
  await page.fill('#pay-amount', '1');
  const bad = await click('pay');
  assert.ok(!bad.ok && /address/i.test(bad.status), bad.status);
  assert.equal(web('balance').online_cents, b.online_cents);
  assert.deepEqual(problems, []);
});

test('the page API refuses callers without the session key or from another host', async () => {
  const u = new URL(pageUrl);
  const key = u.hash.slice(1);
  const host = u.host;
  assert.equal(await raw('/api/state', { host, 'content-type': 'application/json' }), 401);
  assert.equal(await raw('/api/state', { host, 'x-florin-session': '0'.repeat(64) }), 401);
  assert.equal(await raw('/api/state', { host: 'evil.example:' + u.port, 'x-florin-session': key }), 403);
  assert.equal(await raw('/api/state', { host, 'x-florin-session': key }), 200);
  assert.equal(await raw('/api/no-such', { host, 'x-florin-session': key }), 404);
  const r = await fetch(new URL('/', pageUrl));
  const csp = r.headers.get('content-security-policy');
  assert.ok(csp.includes("default-src 'self'") && csp.includes("frame-ancestors 'none'"), csp);
});
