// Code breakpoints: setFunctionBreakpoints and setBreakpoints on a program
// the adapter launches (tests/c/breaks.c): main hands a heap record to
// handle_conn(struct conn *c), which calls set_state, the writer of
// c->state. A function breakpoint set during configuration stops
// handle_conn's first run; its Locals show `c` and, under it, the record's
// members; a data breakpoint on c->state from that stop catches
// set_state's store. A line breakpoint stops at its line with the locals
// of that point. Names and lines with no code are answered verified:false
// with a message, and change nothing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { client, nextStop, env, num } from './lib.mjs';

const PROGRAM = env('BREAKS_PROGRAM');
const SOURCE = env('BREAKS_SOURCE');

/// The 1-based line of the `LINE:<tag>` marker in breaks.c.
function lineOf(tag) {
  const lines = fs.readFileSync(SOURCE, 'utf8').split('\n');
  const i = lines.findIndex((l) => l.includes(`LINE:${tag} `));
  assert.ok(i >= 0, `no LINE:${tag} in ${SOURCE}`);
  return i + 1;
}

async function launch(dc) {
  const init = await dc.initializeRequest({
    adapterID: 'wpd', clientID: 'node-test', linesStartAt1: true, columnsStartAt1: true,
    pathFormat: 'path',
  });
  assert.equal(init.body.supportsFunctionBreakpoints, true);
  const initialized = dc.waitForEvent('initialized');
  const proc = dc.waitForEvent('process');
  await dc.launchRequest({ program: PROGRAM });
  await initialized;
  return (await proc).body.systemProcessId;
}

function output(dc) {
  const out = { stdout: '' };
  dc.on('output', (e) => {
    if (e.body.category === 'stdout') out.stdout += e.body.output;
  });
  return out;
}

const vars = async (dc, ref) => (await dc.variablesRequest({ variablesReference: ref })).body.variables;

/// Locals of frame `frameId`, by name.
async function locals(dc, frameId) {
  const scopes = (await dc.scopesRequest({ frameId })).body.scopes;
  const l = scopes.find((s) => s.name === 'Locals');
  assert.ok(l, JSON.stringify(scopes));
  const list = await vars(dc, l.variablesReference);
  return { ref: l.variablesReference, byName: Object.fromEntries(list.map((v) => [v.name, v])) };
}

test('a function breakpoint stops handle_conn; a data breakpoint from its locals catches the writer', async () => {
  const dc = await client();
  try {
    const out = output(dc);
    const pid = await launch(dc);
    // Unknown names and conditions are refused one by one; the good ones
    // are set. set_state runs once: with its hit condition it never stops
    // (else the stop in set_state below would be its, not the data
    // breakpoint's).
    const list = [{ name: 'handle_conn' }, { name: 'set_state', hitCondition: '>= 2' }];
    const set = (await dc.setFunctionBreakpointsRequest({
      breakpoints: [{ name: 'handle_con' }, list[0], { name: 'set_state', condition: 's == 7' }, list[1]],
    })).body.breakpoints;
    assert.equal(set.length, 4);
    assert.equal(set[3].verified, true, JSON.stringify(set[3]));
    assert.equal(set[0].verified, false);
    assert.match(set[0].message, /handle_con.*closest: handle_conn/, JSON.stringify(set[0]));
    assert.equal(set[2].verified, false);
    assert.match(set[2].message, /condition/);
    const bp = set[1];
    assert.equal(bp.verified, true, JSON.stringify(bp));
    // Past the prologue: the body's first line.
    assert.equal(bp.line, lineOf('handle_first'));
    assert.equal(bp.source.name, 'breaks.c');
    // Setting the same list again keeps the breakpoints (same ids).
    const again = (await dc.setFunctionBreakpointsRequest({ breakpoints: list })).body.breakpoints;
    assert.deepEqual(again.map((b) => b.id), [bp.id, set[3].id]);

    const stop = nextStop(dc);
    await dc.configurationDoneRequest();
    const ev = await stop;
    assert.equal(ev.body.reason, 'function breakpoint', JSON.stringify(ev.body));
    assert.equal(ev.body.threadId, pid);
    assert.deepEqual(ev.body.hitBreakpointIds, [bp.id]);
    assert.equal(out.stdout, '', 'nothing printed before the stop');

    const frames = (await dc.stackTraceRequest({ threadId: pid })).body.stackFrames;
    assert.equal(frames[0].name, 'handle_conn');
    assert.equal(frames[0].line, lineOf('handle_first'));
    assert.equal(frames[1].name, 'main');
    const { ref: localsRef, byName } = await locals(dc, frames[0].id);
    const c = byName.c;
    assert.ok(c, JSON.stringify(Object.keys(byName)));
    assert.equal(c.type, 'struct conn *');
    assert.ok(c.variablesReference > 0, 'the pointer has its record under it');
    const fields = Object.fromEntries((await vars(dc, c.variablesReference)).map((v) => [v.name, v]));
    assert.equal(num(fields.fd.value), 3n);
    assert.equal(num(fields.state.value), 1n);
    assert.equal(num(fields.bytes.value), 0n);

    // The record's member, as an IDE asks from the expanded pointer...
    const info = (await dc.dataBreakpointInfoRequest({
      name: 'state', variablesReference: c.variablesReference,
    })).body;
    assert.ok(info.dataId, JSON.stringify(info));
    // ...and from the Locals scope by an expression on the local.
    const viaLocals = (await dc.dataBreakpointInfoRequest({
      name: 'c->state', variablesReference: localsRef,
    })).body;
    assert.ok(viaLocals.dataId, JSON.stringify(viaLocals));
    assert.match(viaLocals.description, /4 bytes at/);
    assert.equal(viaLocals.dataId.startsWith('addr:'), true, viaLocals.dataId);

    const data = (await dc.setDataBreakpointsRequest({ breakpoints: [{ dataId: viaLocals.dataId }] })).body;
    assert.equal(data.breakpoints[0].verified, true, JSON.stringify(data));
    const hit = nextStop(dc);
    await dc.continueRequest({ threadId: pid });
    const dev = await hit;
    assert.equal(dev.body.reason, 'data breakpoint', JSON.stringify(dev.body));
    assert.deepEqual(dev.body.hitBreakpointIds, [data.breakpoints[0].id]);
    const wframes = (await dc.stackTraceRequest({ threadId: pid })).body.stackFrames;
    assert.equal(wframes[0].name, 'set_state');
    assert.equal(wframes[1].name, 'handle_conn');
    const wl = (await locals(dc, wframes[0].id)).byName;
    assert.equal(num(wl.s.value), 7n);

    // free() stores over the record: the data breakpoint goes first.
    // handle_conn runs once: the rest runs to the end.
    await dc.setDataBreakpointsRequest({ breakpoints: [] });
    const exited = dc.waitForEvent('exited');
    await dc.continueRequest({ threadId: pid });
    assert.equal((await exited).body.exitCode, 0);
    assert.equal(out.stdout, 'result 20 bytes 13\n');
    await dc.disconnectRequest({});
  } finally {
    dc._adapterProcess?.kill();
  }
});

test('a line breakpoint stops at its line; lines without code are refused', async () => {
  const dc = await client();
  try {
    const out = output(dc);
    const pid = await launch(dc);
    const line = lineOf('call_set_state');
    const set = (await dc.setBreakpointsRequest({
      source: { path: SOURCE },
      breakpoints: [{ line: lineOf('no_code') }, { line }, { line: 100000 }],
    })).body.breakpoints;
    assert.equal(set.length, 3);
    assert.equal(set[0].verified, false, JSON.stringify(set[0]));
    assert.match(set[0].message, /no code at .*breaks\.c:\d+/);
    assert.equal(set[2].verified, false);
    assert.match(set[2].message, /no code/);
    assert.equal(set[1].verified, true, JSON.stringify(set[1]));
    assert.equal(set[1].line, line);
    // A file no line table names: perhaps a library's, loaded later, so
    // pending.
    const other = (await dc.setBreakpointsRequest({
      source: { path: '/nowhere/other.c' }, breakpoints: [{ line: 3 }],
    })).body.breakpoints;
    assert.equal(other[0].verified, false);
    assert.equal(other[0].reason, 'pending', JSON.stringify(other[0]));
    assert.match(other[0].message, /no line table names "\/nowhere\/other\.c"/);

    const stop = nextStop(dc);
    await dc.configurationDoneRequest();
    const ev = await stop;
    assert.equal(ev.body.reason, 'breakpoint', JSON.stringify(ev.body));
    assert.deepEqual(ev.body.hitBreakpointIds, [set[1].id]);
    const frames = (await dc.stackTraceRequest({ threadId: pid })).body.stackFrames;
    assert.equal(frames[0].name, 'handle_conn');
    assert.equal(frames[0].line, line);
    const l = (await locals(dc, frames[0].id)).byName;
    // before = state * 10 + fd, computed on the lines above.
    assert.equal(num(l.before.value), 13n);
    const fields = Object.fromEntries((await vars(dc, l.c.variablesReference)).map((v) => [v.name, v]));
    assert.equal(num(fields.bytes.value), 13n);
    assert.equal(num(fields.state.value), 1n);

    // Clearing the file's breakpoints: the program runs to its end.
    const cleared = (await dc.setBreakpointsRequest({ source: { path: SOURCE }, breakpoints: [] })).body;
    assert.deepEqual(cleared.breakpoints, []);
    const exited = dc.waitForEvent('exited');
    await dc.continueRequest({ threadId: pid });
    assert.equal((await exited).body.exitCode, 0);
    assert.equal(out.stdout, 'result 20 bytes 13\n');
    await dc.disconnectRequest({});
  } finally {
    dc._adapterProcess?.kill();
  }
});
