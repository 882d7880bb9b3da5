// The console on a small cluster's sentinel, in a real browser: every Raft group with its
// replicas (state, leader, term, lag, host address), the audit and a payment; the web wallet
// against the cluster; then a replica is killed for real and the console shows it down while
// its group stays healthy.
// Run by scripts/browser-test.sh (FLORIN_BIN, OUT_DIR, PLAYWRIGHT_CORE, CHROMIUM set there).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, OUT, florinAt, openPage, stop } from './helpers.mjs';

const dir = mkdtempSync(join(tmpdir(), 'florin-cluster-console-'));
const data = join(dir, 'cluster');
let url;
let browser;
let page;
let up = false;
let serve;
const problems = [];

const florin = (...args) => florinAt(dir, url, join(data, 'tls', 'ca.pem'),
  { FLORIN_OPERATOR_KEY: join(data, 'operator.key') }, ...args);

// A free port below the range the system hands out for outgoing connections (the replicas'
// own connections cannot take it between this check and `cluster up`).
async function freePort() {
  const low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]) || 32768;
  for (let tries = 0; tries < 64; tries++) {
    const port = Math.max(1024, low - 16000) + Math.floor(Math.random() * 15000);
    const free = await new Promise((resolve) => {
      const s = createServer();
      s.once('error', () => resolve(false));
      s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
    });
    if (free) return port;
  }
  throw new Error('no free port');
}

before(async () => {
  const port = await freePort();
  url = 'https://127.0.0.1:' + port;
  // Stopped in `after` even when `up` fails half-way (it leaves what it started running).
  up = true;
  florin('cluster', 'up', '--data', data, '--shards', '1', '--replicas', '3', '--coordinators', '1',
    '--sentinels', '1', '--api', '127.0.0.1:' + port, '--faucet');
  ({ browser, page } = await openPage(problems));
});

after(async () => {
  if (serve) await stop(serve);
  if (browser) await browser.close();
  if (up) { try { florin('cluster', 'down', '--data', data); } catch (e) { console.error(String(e)); } }
  rmSync(dir, { recursive: true, force: true });
});

const groupRows = () => page.$$eval('#groups tr[data-group]', (rs) => rs.map((r) => ({
  group: r.dataset.group, state: r.dataset.state, id: r.children[1].textContent, text: r.textContent,
})));

test('a sentinel\'s console shows every group, each with one leader, and a payment', async () => {
  await page.goto(url + '/console');
  // The groups are an operator's view (they show the internal addresses): the cluster's
  // operator key, signing in the page.
  await page.waitForFunction(() => document.getElementById('groups-note').textContent.includes('load the operator key'));
  await page.setInputFiles('#opkey', join(data, 'operator.key'));
  await page.waitForFunction(() => document.getElementById('opwho').textContent.startsWith('signing as eur1'));
  // Shard 0, coordinator 0 (three replicas each) and the authority group (the sentinel).
  await page.waitForFunction(() => document.querySelectorAll('#groups tr[data-group]').length === 7, null, { timeout: 30_000 });
  await page.waitForFunction(() => document.getElementById('groups-note').textContent.includes('all healthy'), null, { timeout: 30_000 });
  const rows = await groupRows();
  for (const g of ['shard-0', 'coordinator-0']) {
    const members = rows.filter((r) => r.group === g);
    assert.equal(members.length, 3, g);
    assert.equal(members.filter((m) => m.state === 'leader').length, 1, g + ': one leader');
    assert.ok(members.every((m) => /127\.0\.0\.1:\d+/.test(m.text)), g + ': host addresses shown');
  }
  assert.equal(rows.filter((r) => r.group === 'authority-0').length, 1);

  // Money moves through the cluster and the console sees it.
  florin('wallet', '--wallet', 'a', '--json', 'new', '--no-passphrase');
  florin('wallet', '--wallet', 'b', '--json', 'new', '--no-passphrase');
  florin('wallet', '--wallet', 'a', '--json', 'faucet', '3');
  const b = florin('wallet', '--wallet', 'b', '--json', 'address').address;
  const paid = florin('wallet', '--wallet', 'a', '--json', 'pay', b, '1');
  assert.equal(paid.status, 'confirmed');
  // Recent transactions: the operator's view, refreshed on demand.
  await page.click('#oprefresh');
  await page.waitForFunction((txid) => document.getElementById('recent').textContent.includes(txid), paid.txid, { timeout: 15_000 });
  await page.waitForFunction(() => document.getElementById('balanced').textContent === 'balanced', null, { timeout: 15_000 });
  await page.screenshot({ path: join(OUT, 'cluster-console.png'), fullPage: true });
});

test('the web wallet works against the cluster: its balance, a payment through the sentinel', async () => {
  serve = spawn(BIN, ['wallet', '--wallet', 'a', '--json', 'serve', '--listen', '127.0.0.1:0'], {
    cwd: dir,
    env: { ...process.env, FLORIN_NODE: url, FLORIN_CA_CERT: join(data, 'tls', 'ca.pem') },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const pageUrl = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('serve did not start')), 60_000);
    serve.stdout.on('data', (d) => {
      out += d;
      const m = /"url":\s*"([^"]+)"/.exec(out);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
  });
  const wallet = await browser.newPage();
  wallet.on('pageerror', (e) => problems.push('wallet page error: ' + e.message));
  await wallet.goto(pageUrl);
  const online = () => wallet.textContent('#online');
  await wallet.waitForFunction(() => document.getElementById('online').textContent !== '—');
  const before = florin('wallet', '--wallet', 'a', '--json', 'balance').online_cents;
  assert.equal(await online(), '€' + (before / 100).toFixed(2));
  const b = florin('wallet', '--wallet', 'b', '--json', 'address').address;
  // b collects the first test's payment first: what it collects next is the page's alone.
  florin('wallet', '--wallet', 'b', '--json', 'sync');
  await wallet.fill('#pay-address', b);
  await wallet.fill('#pay-amount', '0.50');
  await wallet.click('#pay');
  await wallet.waitForFunction(() => document.getElementById('status').textContent !== 'working…', null, { timeout: 60_000 });
  assert.equal(await wallet.getAttribute('#status', 'class'), 'ok', await wallet.textContent('#status'));
  assert.equal(await online(), '€' + ((before - 50) / 100).toFixed(2));
  assert.equal(florin('wallet', '--wallet', 'b', '--json', 'sync').received_cents, 50);
  await wallet.screenshot({ path: join(OUT, 'cluster-wallet.png'), fullPage: true });
  await wallet.close();
  await stop(serve);
  serve = null;
});

test('a replica killed for real shows down; its group keeps a leader and stays healthy', async () => {
  const rows = await groupRows();
  const follower = rows.find((r) => r.group === 'shard-0' && r.state === 'follower');
  assert.ok(follower, 'a follower of shard 0');
  const id = follower.id;
  florin('cluster', 'kill', 'shard/0/' + id, '--data', data);
  // The killed replica down, and the group still led by one replica and healthy (a new
  // election on a busy machine may take a moment: all in one wait).
  await page.waitForFunction((i) => {
    const rows = [...document.querySelectorAll('#groups tr[data-group="shard-0"]')];
    const down = rows.some((r) => r.dataset.state === 'down' && r.children[1].textContent === i);
    const leaders = rows.filter((r) => r.dataset.state === 'leader').length;
    const healthy = rows.length > 0 && rows[0].textContent.includes('healthy') && !rows[0].textContent.includes('unhealthy');
    return down && leaders === 1 && healthy;
  }, id, { timeout: 30_000 });
  await page.screenshot({ path: join(OUT, 'cluster-console-replica-down.png'), fullPage: true });
  assert.deepEqual(problems, []);
});
