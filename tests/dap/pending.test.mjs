// Pending function breakpoints on a program the adapter launches
// (tests/c/ctarget.c, linked with libctlib.so, whose lib_addr its ready()
// calls once, for the READY line). Set during configuration, before the
// dynamic linker ran, `libctlib.so:lib_addr` is answered verified:false
// (reason "pending"); once the program runs, the library is mapped, a
// `breakpoint` event `changed` says it is verified, and the call stops
// there. With stopOnEntry the same from the entry stop, for `lib_addr`
// named alone (found in none of the modules mapped then). A line
// breakpoint in ctlib.c (setBreakpoints), whose file no line table of the
// modules mapped during configuration names, is pending the same way and
// stops the same call. A misspelled name stays pending (a library loaded
// later may define it); at the next stop its message names the closest
// names among the libraries loaded by then.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, nextStop, env } from './lib.mjs';

const PROGRAM = env('PENDING_PROGRAM');
const LIB_SOURCE = env('CTLIB_SOURCE');
const LIB_ADDR_LINE = Number(env('LIB_ADDR_LINE'));

async function launch(dc, args = {}) {
  await dc.initializeRequest({
    adapterID: 'wpd', clientID: 'node-test', linesStartAt1: true, columnsStartAt1: true,
    pathFormat: 'path',
  });
  const initialized = dc.waitForEvent('initialized');
  const proc = dc.waitForEvent('process');
  await dc.launchRequest({ program: PROGRAM, ...args });
  await initialized;
  return (await proc).body.systemProcessId;
}

/// Sets the pending breakpoint `name`; returns it as answered, its
/// message saying why it is pending (`why`).
async function setPending(dc, name, why) {
  const set = (await dc.setFunctionBreakpointsRequest({
    breakpoints: [{ name }],
  })).body.breakpoints;
  assert.equal(set.length, 1);
  const bp = set[0];
  assert.equal(bp.verified, false, JSON.stringify(bp));
  assert.equal(bp.reason, 'pending', JSON.stringify(bp));
  assert.match(bp.message, why, JSON.stringify(bp));
  assert.ok(bp.id > 0);
  return bp;
}

/// After `go`, the `changed` event verifying `bp`, then the stop in
/// lib_addr (called by ready()), a `reason` stop; continues to the end.
async function resolvesThenStops(dc, pid, bp, go, reason = 'function breakpoint') {
  const changed = dc.waitForEvent('breakpoint');
  const stop = nextStop(dc);
  await go();
  const ev = (await changed).body;
  assert.equal(ev.reason, 'changed', JSON.stringify(ev));
  assert.equal(ev.breakpoint.id, bp.id);
  assert.equal(ev.breakpoint.verified, true, JSON.stringify(ev));
  assert.match(ev.breakpoint.message, /^lib_addr/, JSON.stringify(ev));
  assert.equal(ev.breakpoint.source.name, 'ctlib.c');
  const st = (await stop).body;
  assert.equal(st.reason, reason, JSON.stringify(st));
  assert.equal(st.threadId, pid);
  assert.deepEqual(st.hitBreakpointIds, [bp.id]);
  const frames = (await dc.stackTraceRequest({ threadId: pid })).body.stackFrames;
  assert.equal(frames[0].name, 'lib_addr');
  assert.equal(frames[1].name, 'ready');
  const exited = dc.waitForEvent('exited');
  await dc.continueRequest({ threadId: pid });
  assert.equal((await exited).body.exitCode, 0);
}

test('a function breakpoint in a library not loaded yet is pending, then stops', async () => {
  const dc = await client();
  try {
    const pid = await launch(dc);
    const bp = await setPending(dc, 'libctlib.so:lib_addr', /no module "libctlib\.so" is loaded yet/);
    await resolvesThenStops(dc, pid, bp, () => dc.configurationDoneRequest());
  } finally {
    dc._adapterProcess?.kill();
  }
});

test('by its name alone, set at the entry stop, it is pending, then stops', async () => {
  const dc = await client();
  try {
    const pid = await launch(dc, { stopOnEntry: true });
    const entry = nextStop(dc);
    await dc.configurationDoneRequest();
    assert.equal((await entry).body.reason, 'entry');
    // Only the executable and the dynamic linker are mapped: the name is
    // found nowhere yet.
    const bp = await setPending(dc, 'lib_addr', /no function named "lib_addr" in the 2 modules loaded/);
    await resolvesThenStops(dc, pid, bp, () => dc.continueRequest({ threadId: pid }));
  } finally {
    dc._adapterProcess?.kill();
  }
});

test('a line of a library not loaded yet is pending, then stops', async () => {
  const dc = await client();
  try {
    const pid = await launch(dc);
    const set = (await dc.setBreakpointsRequest({
      source: { path: LIB_SOURCE },
      breakpoints: [{ line: LIB_ADDR_LINE }],
    })).body.breakpoints;
    assert.equal(set.length, 1);
    const bp = set[0];
    assert.equal(bp.verified, false, JSON.stringify(bp));
    assert.equal(bp.reason, 'pending', JSON.stringify(bp));
    assert.match(bp.message, /ctlib\.c:\d+: pending: no line table names ".*ctlib\.c"/, JSON.stringify(bp));
    assert.match(bp.message, /whose line table has that line/, JSON.stringify(bp));
    assert.ok(bp.id > 0);
    const changed = dc.waitForEvent('breakpoint');
    await resolvesThenStops(dc, pid, bp, () => dc.configurationDoneRequest(), 'breakpoint');
    const ev = (await changed).body;
    assert.equal(ev.breakpoint.line, LIB_ADDR_LINE, JSON.stringify(ev));
    assert.equal(ev.breakpoint.source.path, LIB_SOURCE, JSON.stringify(ev));
  } finally {
    dc._adapterProcess?.kill();
  }
});

test('a misspelled function breakpoint stays pending, with the closest names once loaded', async () => {
  const dc = await client();
  try {
    const pid = await launch(dc);
    const events = [];
    dc.on('breakpoint', (ev) => events.push(ev.body));
    const set = (await dc.setFunctionBreakpointsRequest({
      breakpoints: [{ name: 'lib_adr' }, { name: 'libctlib.so:lib_addr' }],
    })).body.breakpoints;
    assert.equal(set.length, 2);
    const [typo, good] = set;
    for (const bp of set) {
      assert.equal(bp.verified, false, JSON.stringify(bp));
      assert.equal(bp.reason, 'pending', JSON.stringify(bp));
    }
    // Only the executable and the dynamic linker are mapped yet.
    assert.match(typo.message, /no function named "lib_adr" in the 2 modules loaded/);
    assert.doesNotMatch(typo.message, /lib_addr/);
    const stop = nextStop(dc);
    await dc.configurationDoneRequest();
    const st = (await stop).body;
    assert.deepEqual(st.hitBreakpointIds, [good.id], JSON.stringify(st));
    // Told before the stop: the good one verified, the misspelled one
    // still pending, now with the library's name among the closest.
    const mine = (id) => events.filter((e) => e.breakpoint.id === id);
    assert.ok(mine(good.id).some((e) => e.breakpoint.verified), JSON.stringify(events));
    const changed = mine(typo.id);
    assert.equal(changed.length, 1, JSON.stringify(events));
    assert.equal(changed[0].reason, 'changed');
    assert.equal(changed[0].breakpoint.verified, false);
    assert.equal(changed[0].breakpoint.reason, 'pending');
    assert.match(changed[0].breakpoint.message,
      /^lib_adr: pending: no function named "lib_adr" in the \d+ modules loaded \(closest: [^)]*\blib_addr\b/);
    const exited = dc.waitForEvent('exited');
    await dc.continueRequest({ threadId: pid });
    assert.equal((await exited).body.exitCode, 0);
  } finally {
    dc._adapterProcess?.kill();
  }
});
