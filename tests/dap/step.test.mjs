// Stepping (next, stepIn, stepOut, by line and by instruction) in a
// running process attached to: tests/c/stepping.c, whose thread `stepper`
// loops over step_here, middle (which calls leaf, getpid and the recursive
// fact) while worker threads run. A function breakpoint on step_here stops
// the stepper; every step then ends with a `stopped` event of reason
// `step` at the expected function and line (at -O2, OPT=O2, only the
// functions are checked: lines move). A data breakpoint that another
// thread hits during a step, and a code breakpoint reached inside a call
// stepped over, end the step as their own stops. The Rust side checks the
// target is alive and untraced afterwards.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { client, attach, nextStop, env } from './lib.mjs';

const SOURCE = env('STEP_SOURCE');
const O2 = process.env.OPT === 'O2';
const STOP_ON_HIT = process.env.STOP_ON_HIT || 'all';

function lineOf(tag) {
  const lines = fs.readFileSync(SOURCE, 'utf8').split('\n');
  const i = lines.findIndex((l) => l.includes(`LINE:${tag} `));
  assert.ok(i >= 0, `no LINE:${tag}`);
  return i + 1;
}

/// Attached, stopped in step_here (the function breakpoint then removed):
/// the stepper's thread id.
async function stopInStepper(dc) {
  const caps = await attach(dc, { stopOnHit: STOP_ON_HIT });
  assert.equal(caps.supportsSteppingGranularity, true);
  assert.equal(caps.supportsDisassembleRequest, true);
  assert.equal(caps.supportsWriteMemoryRequest, true);
  const stop = nextStop(dc);
  const set = (await dc.setFunctionBreakpointsRequest({ breakpoints: [{ name: 'step_here' }] }))
    .body.breakpoints;
  assert.equal(set[0].verified, true, JSON.stringify(set[0]));
  await dc.configurationDoneRequest();
  const ev = await stop;
  assert.equal(ev.body.reason, 'function breakpoint', JSON.stringify(ev.body));
  // Removed, it lets a thread it stopped alone go (stopOnHit thread): kept
  // then (the steps below do not pass it again).
  if (STOP_ON_HIT === 'all') await dc.setFunctionBreakpointsRequest({ breakpoints: [] });
  return ev.body.threadId;
}

async function top(dc, tid) {
  return (await dc.stackTraceRequest({ threadId: tid, levels: 2 })).body.stackFrames;
}

/// One step request; its `stopped` event (reason `step`) and the new top
/// frames.
async function step(dc, tid, command, args = {}) {
  const ev = nextStop(dc);
  const single = process.env.SINGLE ? process.env.SINGLE === '1' : STOP_ON_HIT === 'thread';
  await dc.send(command, { threadId: tid, singleThread: single, ...args });
  const e = await ev;
  assert.equal(e.body.reason, 'step', JSON.stringify(e.body));
  assert.ok(!/failed/.test(e.body.description || ''), `${command}: ${e.body.description}`);
  assert.equal(e.body.threadId, tid);
  const frames = await top(dc, tid);
  return { ms: e.ms, f: frames[0], caller: frames[1] };
}

/// `next` until the stepper is at `line` of `name` (at most `n` steps).
async function nextTo(dc, tid, name, line, n = 8) {
  for (let i = 0; i < n; i++) {
    const { f } = await step(dc, tid, 'next');
    if (f.name === name && (O2 || f.line === line)) return f;
  }
  assert.fail(`not at ${name}:${line} after ${n} steps`);
}

test('next, stepIn, stepOut and instruction steps land where they should', async () => {
  const dc = await client();
  const times = [];
  try {
    const tid = await stopInStepper(dc);
    await nextTo(dc, tid, 'stepper', lineOf('loop_call'));
    let s = await step(dc, tid, 'stepIn');
    times.push(s.ms);
    assert.equal(s.f.name, 'middle', JSON.stringify(s.f));
    if (!O2) {
      assert.equal(s.f.line, lineOf('middle_call'));
      s = await step(dc, tid, 'stepIn');
      assert.equal(s.f.name, 'leaf');
      assert.equal(s.f.line, lineOf('leaf_first'));
      assert.equal(s.caller.name, 'middle');
      s = await step(dc, tid, 'stepOut');
      times.push(s.ms);
      assert.equal(s.f.name, 'middle');
      assert.equal(s.f.line, lineOf('middle_call'), 'back in the caller, after the call');
      s = await step(dc, tid, 'next');
      times.push(s.ms);
      assert.equal(s.f.line, lineOf('middle_libc'));
      s = await step(dc, tid, 'next');
      assert.equal(s.f.name, 'middle', 'getpid (no line information) ran through');
      assert.equal(s.f.line, lineOf('middle_ret'));
      // Recursion: into fact, into it again, out of the inner activation
      // only.
      s = await step(dc, tid, 'stepIn');
      assert.equal(s.f.name, 'fact');
      assert.equal(s.f.line, lineOf('fact_test'));
      s = await nextTo(dc, tid, 'fact', lineOf('fact_rec'));
      s = await step(dc, tid, 'stepIn');
      assert.equal(s.f.name, 'fact');
      assert.equal(s.caller.name, 'fact');
      s = await step(dc, tid, 'stepOut');
      assert.equal(s.f.name, 'fact', 'out of the inner activation only');
      assert.equal(s.f.line, lineOf('fact_rec'));
      assert.equal(s.caller.name, 'middle');
      s = await step(dc, tid, 'stepOut');
      assert.equal(s.f.name, 'middle');
    }
    s = await step(dc, tid, 'stepOut');
    times.push(s.ms);
    assert.equal(s.f.name, 'stepper');
    // Instruction steps: one instruction each, in the same function.
    const pc0 = BigInt(s.f.instructionPointerReference);
    s = await step(dc, tid, 'next', { granularity: 'instruction' });
    times.push(s.ms);
    const pc1 = BigInt(s.f.instructionPointerReference);
    assert.ok(pc1 > pc0 && pc1 - pc0 <= 15n, `${pc0} -> ${pc1}`);
    s = await step(dc, tid, 'stepIn', { granularity: 'instruction' });
    assert.notEqual(BigInt(s.f.instructionPointerReference), pc1);
    // The instructions around where it is.
    const dis = (await dc.send('disassemble', {
      memoryReference: s.f.instructionPointerReference, instructionOffset: -2, instructionCount: 6,
    })).body.instructions;
    assert.equal(dis.length, 6);
    assert.equal(BigInt(dis[2].address), BigInt(s.f.instructionPointerReference), JSON.stringify(dis));
    assert.ok(dis[2].instruction.length > 0);
    console.log(`step times (ms): ${times.map((t) => t.toFixed(1)).join(' ')}`);
    await dc.continueRequest({ threadId: tid });
    await dc.disconnectRequest({ terminateDebuggee: false });
  } finally {
    dc._adapterProcess?.kill();
  }
});

test('a step ends at a code breakpoint in a call, and at another thread\'s data breakpoint', async (t) => {
  if (STOP_ON_HIT === 'thread') return t.skip('all-stop only');
  // Beside 1,000 workers every one writes the watched `hot`: a stop of all
  // of them per hit. The session beside 1,000 threads checks the steps.
  if (process.env.STEPS_ONLY === '1') return t.skip('the steps only');
  const dc = await client();
  try {
    const tid = await stopInStepper(dc);
    await nextTo(dc, tid, 'stepper', lineOf('loop_call'));
    // Over middle(), which calls leaf: the function breakpoint there stops it.
    const set = (await dc.setFunctionBreakpointsRequest({ breakpoints: [{ name: 'leaf' }] }))
      .body.breakpoints;
    assert.equal(set[0].verified, true);
    let ev = nextStop(dc);
    await dc.nextRequest({ threadId: tid });
    let e = await ev;
    assert.equal(e.body.reason, 'function breakpoint', JSON.stringify(e.body));
    assert.equal(e.body.threadId, tid);
    assert.equal((await top(dc, tid))[0].name, 'leaf');
    await dc.setFunctionBreakpointsRequest({ breakpoints: [] });
    // heat = 1 (writeMemory): the workers write `hot` as soon as they run;
    // a data breakpoint on it stops the step of the stepper.
    const heat = (await dc.evaluateRequest({ expression: '&heat' })).body;
    const addr = heat.memoryReference || heat.result.split(' ')[0];
    const w = (await dc.send('writeMemory', {
      memoryReference: addr, data: Buffer.from([1, 0, 0, 0]).toString('base64'),
    })).body;
    assert.equal(w.bytesWritten, 4);
    const info = (await dc.dataBreakpointInfoRequest({ name: 'hot' })).body;
    const data = (await dc.setDataBreakpointsRequest({ breakpoints: [{ dataId: info.dataId }] })).body;
    assert.equal(data.breakpoints[0].verified, true, JSON.stringify(data));
    // A step ends at the first worker's store. A short step may end before
    // any worker ran (a loaded machine schedules them late): step on, at
    // most to the line calling slow(), which sleeps 300 ms with heat set.
    let hit = null;
    for (let i = 0; i < 20 && !hit; i++) {
      ev = nextStop(dc);
      await dc.nextRequest({ threadId: tid });
      e = await ev;
      if (e.body.reason === 'data breakpoint') hit = e;
      else assert.equal(e.body.reason, 'step', JSON.stringify(e.body));
    }
    assert.ok(hit, 'no worker wrote `hot` in 20 steps, one of them over a 300 ms sleep');
    assert.notEqual(hit.body.threadId, tid, 'a worker hit it');
    await dc.setDataBreakpointsRequest({ breakpoints: [] });
    await dc.send('writeMemory', { memoryReference: addr, data: Buffer.from([0, 0, 0, 0]).toString('base64') });
    await dc.continueRequest({ threadId: tid });
    await dc.disconnectRequest({ terminateDebuggee: false });
  } finally {
    dc._adapterProcess?.kill();
  }
});
