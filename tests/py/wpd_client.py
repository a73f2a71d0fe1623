"""A gRPC client of wpd in Python, run by tests/e2e/grpc_clients.rs.

Generates the stubs from proto/ (grpcio-tools), then, on the daemon's Unix
socket with the library's default options: health check, reflection (the
services listed), SetWatchpoint by name on a target the test started, and
StreamEvents until N hits came. Prints one JSON line with what it saw.

  wpd_client.py --impl grpcio|grpcio-path-authority|grpclib \
      --socket PATH --proto-dir DIR --out DIR --pid PID --symbol NAME --hits N

`grpcio` is grpc-core (it sends the percent-encoded socket path as
:authority); `grpcio-path-authority` makes it send the raw path, as
grpc-java and grpc-swift do; `grpclib` is a pure-Python implementation
(h2), for the same calls through another HTTP/2 stack.
"""

import argparse
import asyncio
import json
import os
import sys


def generate(proto_dir, out, grpclib):
    from grpc_tools import protoc

    args = ["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}"]
    if grpclib:
        args.append(f"--grpclib_python_out={out}")
    args.append(os.path.join(proto_dir, "wpd/v1/wpd.proto"))
    if protoc.main(args) != 0:
        sys.exit("protoc failed")
    sys.path.insert(0, out)


def run_grpcio(a, options):
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    from wpd.v1 import wpd_pb2, wpd_pb2_grpc

    seen = {}
    with grpc.insecure_channel(f"unix:{a.socket}", options=options) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        seen["health"] = health_pb2.HealthCheckResponse.ServingStatus.Name(
            health.Check(health_pb2.HealthCheckRequest(service="wpd.v1.Watchpoints"), timeout=10).status
        )
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        replies = refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
        )
        seen["services"] = sorted(s.name for r in replies for s in r.list_services_response.service)
        stub = wpd_pb2_grpc.WatchpointsStub(ch)
        events = stub.StreamEvents(wpd_pb2.StreamEventsRequest(pid=a.pid, hits_only=True), timeout=30)
        resp = stub.SetWatchpoint(
            wpd_pb2.SetWatchpointRequest(
                spec=wpd_pb2.WatchpointSpec(pid=a.pid, symbol=a.symbol, access=wpd_pb2.ACCESS_WRITE)
            ),
            timeout=30,
        )
        seen["watchpoint"] = resp.watchpoint.id
        seen["symbol_address"] = resp.symbol.address
        hits = []
        for ev in events:
            if ev.WhichOneof("event") == "hit":
                hits.append(ev.hit)
                if len(hits) >= a.hits:
                    break
        events.cancel()
        seen["hits"] = len(hits)
        seen["hit_functions"] = sorted({h.location.function for h in hits})
        seen["hit_addresses"] = sorted({h.address for h in hits})
        # A refusal comes back as a status with its reason.
        try:
            stub.SetWatchpoint(
                wpd_pb2.SetWatchpointRequest(
                    spec=wpd_pb2.WatchpointSpec(pid=a.pid, symbol="no_such_name", access=wpd_pb2.ACCESS_WRITE)
                ),
                timeout=10,
            )
            seen["refusal"] = "none"
        except grpc.RpcError as e:
            seen["refusal"] = e.code().name
        stub.RemoveWatchpoint(wpd_pb2.RemoveWatchpointRequest(id=resp.watchpoint.id), timeout=10)
    return seen


async def run_grpclib(a):
    from grpclib.client import Channel
    from grpclib.exceptions import GRPCError
    from grpclib.health.v1 import health_pb2, health_grpc
    from wpd.v1 import wpd_pb2, wpd_grpc

    seen = {}
    ch = Channel(path=a.socket)
    try:
        health = health_grpc.HealthStub(ch)
        r = await health.Check(health_pb2.HealthCheckRequest(service="wpd.v1.Watchpoints"), timeout=10)
        seen["health"] = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
        stub = wpd_grpc.WatchpointsStub(ch)
        async with stub.StreamEvents.open(timeout=30) as events:
            await events.send_message(wpd_pb2.StreamEventsRequest(pid=a.pid, hits_only=True), end=True)
            resp = await stub.SetWatchpoint(
                wpd_pb2.SetWatchpointRequest(
                    spec=wpd_pb2.WatchpointSpec(pid=a.pid, symbol=a.symbol, access=wpd_pb2.ACCESS_WRITE)
                ),
                timeout=30,
            )
            seen["watchpoint"] = resp.watchpoint.id
            seen["symbol_address"] = resp.symbol.address
            hits = []
            async for ev in events:
                if ev.WhichOneof("event") == "hit":
                    hits.append(ev.hit)
                    if len(hits) >= a.hits:
                        break
            await events.cancel()
        seen["hits"] = len(hits)
        seen["hit_functions"] = sorted({h.location.function for h in hits})
        seen["hit_addresses"] = sorted({h.address for h in hits})
        try:
            await stub.SetWatchpoint(
                wpd_pb2.SetWatchpointRequest(
                    spec=wpd_pb2.WatchpointSpec(pid=a.pid, symbol="no_such_name", access=wpd_pb2.ACCESS_WRITE)
                ),
                timeout=10,
            )
            seen["refusal"] = "none"
        except GRPCError as e:
            seen["refusal"] = e.status.name
        await stub.RemoveWatchpoint(wpd_pb2.RemoveWatchpointRequest(id=resp.watchpoint.id), timeout=10)
    finally:
        ch.close()
    return seen


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--impl", required=True, choices=["grpcio", "grpcio-path-authority", "grpclib"])
    p.add_argument("--socket", required=True)
    p.add_argument("--proto-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--symbol", required=True)
    p.add_argument("--hits", type=int, default=5)
    a = p.parse_args()
    generate(a.proto_dir, a.out, a.impl == "grpclib")
    if a.impl == "grpcio":
        seen = run_grpcio(a, [])
    elif a.impl == "grpcio-path-authority":
        seen = run_grpcio(a, [("grpc.default_authority", a.socket)])
    else:
        seen = asyncio.run(run_grpclib(a))
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
