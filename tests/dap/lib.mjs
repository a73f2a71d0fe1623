// Shared by the DAP tests: the client VS Code's adapters are tested with
// (@vscode/debugadapter-testsupport's DebugClient), started on `wpctl dap`
// over stdio, or connected to `wpctl dap --listen` over TCP or a Unix socket.
import { createRequire } from 'node:module';
import net from 'node:net';
import assert from 'node:assert/strict';

const require = createRequire(import.meta.url);
const { DebugClient } = require('@vscode/debugadapter-testsupport');

export const env = (name) => {
  const v = process.env[name];
  assert.ok(v, `${name} is not set (the Rust test sets it)`);
  return v;
};

export const PID = Number(env('TARGET_PID'));

/// A client on `wpctl dap` (stdio), or on DAP_PORT (TCP) or DAP_SOCKET (a
/// Unix socket's path) when set. Over a socket, `dc.closed` resolves when
/// the adapter closes the connection.
export async function client() {
  const dc = new DebugClient(env('WPCTL'), 'dap', 'wpd', {
    env: { ...process.env, WPD_ENDPOINT: env('WPD_ENDPOINT') },
  }, true);
  dc.defaultTimeout = 20000;
  if (process.env.DAP_SOCKET) {
    const sock = net.createConnection({ path: process.env.DAP_SOCKET });
    await new Promise((resolve, reject) => {
      sock.once('connect', resolve);
      sock.once('error', reject);
    });
    dc._socket = sock;
    dc.connect(sock, sock);
  } else {
    const port = process.env.DAP_PORT ? Number(process.env.DAP_PORT) : undefined;
    await dc.start(port);
  }
  if (dc._socket) {
    // A write after the adapter closed is an 'error' event: not a crash.
    dc._socket.on('error', () => {});
    dc.closed = new Promise((resolve) => dc._socket.once('close', resolve));
  }
  return dc;
}

/// initialize + attach + configurationDone, as an IDE does; returns the
/// initialize response's capabilities.
export async function attach(dc, args = {}) {
  const init = await dc.initializeRequest({
    adapterID: 'wpd', clientID: 'node-test', linesStartAt1: true, columnsStartAt1: true,
    pathFormat: 'path', supportsMemoryReferences: true,
  });
  const initialized = dc.waitForEvent('initialized');
  await dc.attachRequest({ pid: PID, ...args });
  await initialized;
  return init.body;
}

/// Resolves with the next `stopped` event; the time it took is `ms`.
export async function nextStop(dc, timeout = 20000) {
  const t0 = process.hrtime.bigint();
  const ev = await dc.waitForEvent('stopped', timeout);
  ev.ms = Number(process.hrtime.bigint() - t0) / 1e6;
  return ev;
}

export const hex = (n) => '0x' + BigInt(n).toString(16);

/// The leading integer of a shown value ("42 (0x2a)" -> 42n).
export const num = (s) => BigInt(String(s).split(' ')[0]);
