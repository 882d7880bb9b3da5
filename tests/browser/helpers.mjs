// Shared by the browser tests: the florin binary, a devnet started and stopped for real, the
// browser.
import { spawn, execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
export const { chromium } = require(process.env.PLAYWRIGHT_CORE);
export const BIN = process.env.FLORIN_BIN;
export const OUT = process.env.OUT_DIR;
mkdirSync(OUT, { recursive: true });

/// Runs `florin ARGS` in `cwd` against `url` (trusting `ca`); its JSON answer, or its text.
export function florinAt(cwd, url, ca, env, ...args) {
  const out = execFileSync(BIN, args, {
    cwd,
    env: { ...process.env, FLORIN_NODE: url, FLORIN_CA_CERT: ca, ...env },
    encoding: 'utf8',
    timeout: 120_000,
  });
  try { return JSON.parse(out); } catch (_) { return out; }
}

/// Starts `florin devnet` on a free loopback port over TLS; resolves to { proc, url }.
export async function startDevnet(data, extra) {
  const proc = spawn(BIN, ['devnet', '--data', data, '--listen', '127.0.0.1:0', '--rate-per-ip', '0',
    '--rate-burst-ip', '0', ...extra], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  const url = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('devnet did not start: ' + stderr)), 120_000);
    proc.stdout.on('data', (d) => {
      out += d;
      const m = /listening on (https:\/\/[0-9.:]+)/.exec(out);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    proc.on('exit', (c) => { clearTimeout(timer); reject(new Error('devnet exited ' + c + ': ' + stderr)); });
  });
  return { proc, url };
}

/// Stops a process with SIGTERM (SIGKILL after 10 s); never waits for one already gone.
export async function stop(proc) {
  if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = new Promise((r) => proc.once('exit', r));
  proc.kill('SIGTERM');
  await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))]);
  if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
}

/// A browser page for a node over TLS (its devnet CA is not in Chromium's store, so the context
/// accepts its certificate: `ignoreHTTPSErrors`), recording script errors and server errors in
/// `problems`.
export async function openPage(problems) {
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ['--no-sandbox'] });
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1280, height: 1300 } });
  const page = await context.newPage();
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  page.on('response', (r) => { if (r.status() >= 500) problems.push(r.status() + ' ' + r.url()); });
  return { browser, page };
}
