// launch: the adapter starts the program itself, held before its first
// instruction until configurationDone, so that a data breakpoint set during
// configuration sees the first store of main. The program (tests/c/
// launched.c) stores into `early` first thing, prints its arguments,
// WPD_LAUNCH_VAR and its directory, writes a line to stderr, and exits with
// its first argument.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { spawn } from 'node:child_process';
import { client, nextStop, env, num } from './lib.mjs';

const PROGRAM = env('LAUNCH_PROGRAM');

/// initialize + launch, as an IDE does; returns the program's pid.
async function launch(dc, args) {
  await dc.initializeRequest({
    adapterID: 'wpd', clientID: 'node-test', linesStartAt1: true, columnsStartAt1: true,
    pathFormat: 'path', supportsMemoryReferences: true,
  });
  const initialized = dc.waitForEvent('initialized');
  const proc = dc.waitForEvent('process');
  await dc.launchRequest({ program: PROGRAM, ...args });
  await initialized;
  const p = (await proc).body;
  assert.equal(p.startMethod, 'launch');
  return p.systemProcessId;
}

/// The program's output as `output` events carry it.
function output(dc) {
  const out = { stdout: '', stderr: '' };
  dc.on('output', (e) => {
    if (e.body.category in out) out[e.body.category] += e.body.output;
  });
  return out;
}

/// Waits until `pid` has ended (gone, or a zombie), failing after 10 s.
async function ended(pid) {
  for (let i = 0; i < 200; i++) {
    let stat;
    try {
      stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    } catch {
      return;
    }
    if (stat.slice(stat.lastIndexOf(')') + 2)[0] === 'Z') return;
    await sleep(50);
  }
  assert.fail(`process ${pid} still runs`);
}

test('a data breakpoint set during configuration stops main\'s first store', async () => {
  const dc = await client();
  try {
    const out = output(dc);
    const pid = await launch(dc, {
      args: ['7', 'two words'], env: { WPD_LAUNCH_VAR: 'hello' }, cwd: '/tmp',
    });
    const info = (await dc.dataBreakpointInfoRequest({ name: 'early' })).body;
    assert.equal(info.dataId, 'name:early', JSON.stringify(info));
    const set = (await dc.setDataBreakpointsRequest({ breakpoints: [{ dataId: info.dataId }] })).body;
    assert.equal(set.breakpoints[0].verified, true, JSON.stringify(set));
    const stop = nextStop(dc);
    await dc.configurationDoneRequest();
    const ev = await stop;
    assert.equal(ev.body.reason, 'data breakpoint', JSON.stringify(ev.body));
    assert.equal(ev.body.threadId, pid);
    const frames = (await dc.stackTraceRequest({ threadId: pid })).body.stackFrames;
    assert.equal(frames[0].name, 'main');
    const early = (await dc.evaluateRequest({ expression: 'early', frameId: frames[0].id })).body;
    assert.equal(num(early.result), 42n);
    // Nothing printed yet: the store is main's first statement.
    assert.equal(out.stdout, '');
    await checkScopes(dc, frames[0].id);
    await dc.setDataBreakpointsRequest({ breakpoints: [] });
    const exited = dc.waitForEvent('exited');
    const terminated = dc.waitForEvent('terminated');
    await dc.continueRequest({ threadId: pid });
    assert.equal((await exited).body.exitCode, 7);
    await terminated;
    assert.equal(out.stdout, 'launched argc=3 [7] [two words] WPD_LAUNCH_VAR=hello cwd=/tmp\n');
    assert.equal(out.stderr, 'to stderr\n');
    await dc.disconnectRequest({});
    await ended(pid);
  } finally {
    dc._adapterProcess?.kill();
  }
});

/// The stop's scopes: Registers (grouped, with rip in main) and Globals
/// (the program's globals, structs and arrays with children).
async function checkScopes(dc, frameId) {
  const scopes = (await dc.scopesRequest({ frameId })).body.scopes;
  const byName = Object.fromEntries(scopes.map((s) => [s.name, s]));
  assert.ok(byName.Locals && byName.Registers, JSON.stringify(scopes));
  const vars = async (ref) => (await dc.variablesRequest({ variablesReference: ref })).body.variables;
  const groups = await vars(byName.Registers.variablesReference);
  const gp = groups.find((g) => g.name === 'General Purpose Registers');
  assert.ok(gp && gp.variablesReference > 0, JSON.stringify(groups));
  const regs = await vars(gp.variablesReference);
  const names = regs.map((r) => r.name);
  for (const r of ['rax', 'rbx', 'rsp', 'rbp', 'rip', 'eflags']) {
    assert.ok(names.includes(r), `${r} in ${names}`);
  }
  const eflags = regs.find((r) => r.name === 'eflags');
  assert.ok(eflags.variablesReference > 0, 'eflags has its flags as children');
  const flags = (await vars(eflags.variablesReference)).map((f) => f.name);
  assert.ok(flags.includes('ZF') && flags.includes('CF'), JSON.stringify(flags));
  await checkGlobals(dc, byName, vars);
}

async function checkGlobals(dc, byName, vars) {
  assert.ok(byName.Globals, JSON.stringify(Object.keys(byName)));
  const globals = await vars(byName.Globals.variablesReference);
  const g = Object.fromEntries(globals.map((v) => [v.name, v]));
  assert.equal(num(g.early.value), 42n);
  assert.equal(num(g.g_calls.value), 5n);
  const limits = g.g_limits;
  assert.ok(limits.variablesReference > 0, JSON.stringify(limits));
  const members = Object.fromEntries((await vars(limits.variablesReference)).map((v) => [v.name, v]));
  assert.equal(num(members.soft.value), 3n);
  assert.equal(num(members.hard.value), 1000n);
  assert.equal(members.hard.evaluateName, 'g_limits.hard');
  assert.equal(members.hard.type, 'long int');
  // A member can be watched from the view: by its expression.
  const info = (await dc.dataBreakpointInfoRequest({
    name: 'hard', variablesReference: limits.variablesReference,
  })).body;
  assert.equal(info.dataId, 'name:g_limits.hard', JSON.stringify(info));
  const range = Object.fromEntries((await vars(members.range.variablesReference)).map((v) => [v.name, v]));
  assert.equal(num(range.lo.value), -2n);
  assert.equal(num(range.hi.value), 9n);
  const table = await vars(g.g_table.variablesReference);
  assert.deepEqual(table.map((v) => v.name), ['[0]', '[1]', '[2]', '[3]']);
  assert.deepEqual(table.map((v) => num(v.value)), [10n, 20n, 30n, 40n]);
  // A pointer: its value, and what it points to as its child.
  assert.equal(g.g_name.type, 'const char *');
  const [pointee] = await vars(g.g_name.variablesReference);
  assert.equal(pointee.name, '*g_name');
  assert.equal(num(pointee.value), 108n); // 'l'
}

test('stopOnEntry stops before the program\'s first instruction', async () => {
  const dc = await client();
  try {
    const out = output(dc);
    const pid = await launch(dc, { stopOnEntry: true });
    const stop = nextStop(dc);
    await dc.configurationDoneRequest();
    const ev = await stop;
    assert.equal(ev.body.reason, 'entry', JSON.stringify(ev.body));
    assert.equal(ev.body.threadId, pid);
    const threads = (await dc.threadsRequest()).body.threads;
    assert.deepEqual(threads.map((t) => t.id), [pid]);
    // It runs with the default scheduling policy, not the adapter's
    // SCHED_FIFO (field 41 of /proc/PID/stat: 0 is SCHED_OTHER).
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    assert.equal(fields[41 - 3], '0', `policy of ${stat}`);
    const frames = (await dc.stackTraceRequest({ threadId: pid })).body.stackFrames;
    assert.ok(frames.length >= 1);
    assert.notEqual(frames[0].name, 'main');
    // main has not run: its first store has not happened.
    const early = (await dc.evaluateRequest({ expression: 'early', frameId: frames[0].id })).body;
    assert.equal(num(early.result), 0n);
    assert.equal(out.stdout, '');
    const exited = dc.waitForEvent('exited');
    const terminated = dc.waitForEvent('terminated');
    await dc.continueRequest({ threadId: pid });
    assert.equal((await exited).body.exitCode, 0);
    await terminated;
    assert.match(out.stdout, /^launched argc=1 WPD_LAUNCH_VAR=\(unset\)/);
    await dc.disconnectRequest({});
  } finally {
    dc._adapterProcess?.kill();
  }
});

test('ending the session kills the program it launched', async () => {
  const dc = await client();
  try {
    const pid = await launch(dc, { stopOnEntry: true });
    const stop = nextStop(dc);
    await dc.configurationDoneRequest();
    await stop;
    await dc.disconnectRequest({});
    await ended(pid);
  } finally {
    dc._adapterProcess?.kill();
  }
});

test('a program that cannot be started is a clear error, and nothing runs', async () => {
  const dc = await client();
  try {
    await dc.initializeRequest({ adapterID: 'wpd', clientID: 'node-test', pathFormat: 'path' });
    await assert.rejects(
      dc.launchRequest({ program: '/nonexistent/program' }),
      /cannot start "\/nonexistent\/program": No such file or directory/,
    );
    await assert.rejects(
      dc.launchRequest({ program: PROGRAM, cwd: '/nonexistent/dir' }),
      /cannot start .*No such file or directory/,
    );
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'wpd-launch-'));
    const text = path.join(dir, 'not-a-program');
    fs.writeFileSync(text, 'text\n', { mode: 0o644 });
    try {
      await assert.rejects(dc.launchRequest({ program: text }), /Permission denied/);
    } finally {
      fs.rmSync(dir, { recursive: true });
    }
    assert.deepEqual((await dc.threadsRequest()).body.threads, []);
    // The session is still usable: a good launch after the bad ones.
    const exited = dc.waitForEvent('exited');
    await dc.launchRequest({ program: PROGRAM, args: ['3'] });
    await dc.configurationDoneRequest();
    assert.equal((await exited).body.exitCode, 3);
    await dc.disconnectRequest({});
  } finally {
    dc._adapterProcess?.kill();
  }
});

test('a client with a terminal runs the program there (runInTerminal)', async () => {
  const dc = await client();
  // The test client answers no reverse request: this one plays the IDE's
  // terminal, running what it is asked to run with its stdout kept.
  let term;
  let termOut = '';
  const dispatch = dc.dispatch.bind(dc);
  const asked = new Promise((resolve) => {
    dc.dispatch = (body) => {
      const m = JSON.parse(body);
      if (m.type !== 'request' || m.command !== 'runInTerminal') return dispatch(body);
      const a = m.arguments;
      term = spawn(a.args[0], a.args.slice(1), {
        cwd: a.cwd, env: { ...process.env, ...a.env }, stdio: ['ignore', 'pipe', 'inherit'],
      });
      term.stdout.on('data', (d) => { termOut += d; });
      const r = JSON.stringify({
        seq: 0, type: 'response', request_seq: m.seq, success: true, command: 'runInTerminal',
        body: { shellProcessId: term.pid },
      });
      dc.outputStream.write(`Content-Length: ${Buffer.byteLength(r)}\r\n\r\n${r}`);
      resolve(a);
    };
  });
  try {
    const out = output(dc);
    await dc.initializeRequest({
      adapterID: 'wpd', clientID: 'node-test', pathFormat: 'path', supportsRunInTerminalRequest: true,
    });
    const initialized = dc.waitForEvent('initialized');
    const proc = dc.waitForEvent('process');
    await dc.launchRequest({ program: PROGRAM, args: ['5'], env: { WPD_LAUNCH_VAR: 'term' }, cwd: '/tmp' });
    const a = await asked;
    assert.equal(a.kind, 'integrated');
    assert.equal(a.cwd, '/tmp');
    await initialized;
    const pid = (await proc).body.systemProcessId;
    assert.notEqual(pid, term.pid, 'the program is the helper\'s child');
    const info = (await dc.dataBreakpointInfoRequest({ name: 'early' })).body;
    await dc.setDataBreakpointsRequest({ breakpoints: [{ dataId: info.dataId }] });
    const stop = nextStop(dc);
    await dc.configurationDoneRequest();
    assert.equal((await stop).body.reason, 'data breakpoint');
    assert.equal(termOut, '');
    const termExit = new Promise((resolve) => term.once('exit', resolve));
    const exited = dc.waitForEvent('exited');
    const terminated = dc.waitForEvent('terminated');
    await dc.setDataBreakpointsRequest({ breakpoints: [] });
    await dc.continueRequest({ threadId: pid });
    assert.equal((await exited).body.exitCode, 5);
    await terminated;
    assert.equal(await termExit, 5);
    assert.equal(termOut, 'launched argc=2 [5] WPD_LAUNCH_VAR=term cwd=/tmp\n');
    assert.equal(out.stdout, '', 'nothing of it came as output events');
    await dc.disconnectRequest({});
  } finally {
    dc._adapterProcess?.kill();
    term?.kill();
  }
});
