// The error table (clients/README.md, "Errors") as the SDK reads a status:
// every class, including those this suite's gateway cannot be made to
// answer (a fleet's or an executor pool's), from the status and trailer the
// gateway would send.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { Metadata, status, type ServiceError } from "@grpc/grpc-js";
import {
  AlreadyExists,
  ConnectionLost,
  DeadlineExceeded,
  errorFromStatus,
  ExecGatewayError,
  ExecutorUnavailable,
  Forbidden,
  Internal,
  InvalidArgument,
  NotFound,
  Overloaded,
  OwnerRestarted,
  OwnerUnavailable,
  QuotaExceeded,
  RateLimited,
  SessionAttached,
  ShuttingDown,
  Unauthenticated,
  Unimplemented,
} from "@exec-gateway/client";

function err(code: status, details: string, data?: unknown): ServiceError {
  const metadata = new Metadata();
  if (data !== undefined) metadata.set("x-exec-gateway-error-data", JSON.stringify(data));
  return Object.assign(new Error(`${code} ${details}`), { code, details, metadata });
}

describe("error mapping", () => {
  test("each status and reason maps to its class, with its fields", () => {
    const cases: [ServiceError, new (...a: never[]) => ExecGatewayError, string][] = [
      [err(status.UNAUTHENTICATED, "invalid signature"), Unauthenticated, "UNAUTHENTICATED"],
      [err(status.PERMISSION_DENIED, "forbidden", { requiredScope: "exec" }), Forbidden, "PERMISSION_DENIED"],
      [err(status.NOT_FOUND, "unknown session id s"), NotFound, "NOT_FOUND"],
      [
        err(status.NOT_FOUND, "session s was owned by replica r", { reason: "ownerRestarted", replica: "r-1" }),
        OwnerRestarted,
        "NOT_FOUND",
      ],
      [err(status.ALREADY_EXISTS, "process p already exists"), AlreadyExists, "ALREADY_EXISTS"],
      [err(status.INVALID_ARGUMENT, "argv must not be empty"), InvalidArgument, "INVALID_ARGUMENT"],
      [err(status.FAILED_PRECONDITION, "session s is already attached"), SessionAttached, "FAILED_PRECONDITION"],
      [err(status.UNAVAILABLE, "Server overloaded; retry later."), Overloaded, "UNAVAILABLE"],
      [
        err(status.UNAVAILABLE, "Server overloaded; retry later.", { reason: "rateLimited", retryAfterMs: 1500 }),
        RateLimited,
        "UNAVAILABLE",
      ],
      [err(status.UNAVAILABLE, "server is shutting down"), ShuttingDown, "UNAVAILABLE"],
      [
        err(status.UNAVAILABLE, "server is shutting down", { reason: "serverShuttingDown" }),
        ShuttingDown,
        "UNAVAILABLE",
      ],
      [
        err(status.UNAVAILABLE, "session s is owned by replica r", { reason: "ownerUnavailable", replica: "r-2" }),
        OwnerUnavailable,
        "UNAVAILABLE",
      ],
      [
        err(status.UNAVAILABLE, "executor e of pool p is unavailable", {
          reason: "executorUnavailable",
          pool: "builders",
          executor: "*",
        }),
        ExecutorUnavailable,
        "UNAVAILABLE",
      ],
      [
        err(status.RESOURCE_EXHAUSTED, "quota exceeded: processes (limit 4)", { quota: "processes", limit: 4 }),
        QuotaExceeded,
        "RESOURCE_EXHAUSTED",
      ],
      [err(status.DEADLINE_EXCEEDED, "request deadline exceeded"), DeadlineExceeded, "DEADLINE_EXCEEDED"],
      [err(status.UNIMPLEMENTED, "unknown method"), Unimplemented, "UNIMPLEMENTED"],
      [err(status.INTERNAL, "Directory not empty (os error 39)"), Internal, "INTERNAL"],
      [err(status.DATA_LOSS, "odd"), Internal, "DATA_LOSS"],
      [err(status.UNAVAILABLE, "read ECONNRESET"), ConnectionLost, "UNAVAILABLE"],
      // An OS error the gateway passes on is its answer, whatever it says.
      [err(status.INTERNAL, "Connection reset by peer (os error 104)"), Internal, "INTERNAL"],
      [
        err(status.INTERNAL, "Received RST_STREAM with code 2 triggered by internal client error"),
        ConnectionLost,
        "UNAVAILABLE",
      ],
    ];
    for (const [e, cls, code] of cases) {
      const mapped = errorFromStatus(e);
      assert.ok(mapped instanceof cls, `${e.details} -> ${mapped.name}`);
      assert.ok(mapped instanceof ExecGatewayError);
      assert.equal(mapped.code, code, e.details);
    }
  });

  test("fields come from the error data; retryAfter is in seconds", () => {
    const rate = errorFromStatus(err(status.UNAVAILABLE, "x", { reason: "rateLimited", retryAfterMs: 1500 }));
    assert.ok(rate instanceof RateLimited && rate instanceof Overloaded);
    assert.equal(rate.retryAfter, 1.5);
    const quota = errorFromStatus(
      err(status.RESOURCE_EXHAUSTED, "x", { quota: "retained_output_bytes", limit: 10, retryAfterMs: 30000 }),
    );
    assert.ok(quota instanceof QuotaExceeded);
    assert.deepEqual([quota.quota, quota.limit, quota.retryAfter], ["retained_output_bytes", 10, 30]);
    assert.deepEqual(quota.data, { quota: "retained_output_bytes", limit: 10, retryAfterMs: 30000 });
    // A quota the gateway reports as UNAVAILABLE is still a quota.
    assert.ok(errorFromStatus(err(status.UNAVAILABLE, "x", { quota: "sessions", limit: 1 })) instanceof QuotaExceeded);
    const owner = errorFromStatus(err(status.NOT_FOUND, "x", { reason: "ownerRestarted", replica: "r-1" }));
    assert.ok(owner instanceof OwnerRestarted && owner instanceof NotFound);
    assert.equal(owner.replica, "r-1");
    const exec = errorFromStatus(
      err(status.UNAVAILABLE, "x", { reason: "executorUnavailable", pool: "p", executor: "e" }),
    );
    assert.ok(exec instanceof ExecutorUnavailable);
    assert.deepEqual([exec.pool, exec.executor], ["p", "e"]);
    const forbidden = errorFromStatus(err(status.PERMISSION_DENIED, "forbidden", { requiredScope: "fs:write" }));
    assert.ok(forbidden instanceof Forbidden);
    assert.equal(forbidden.requiredScope, "fs:write");
  });

  test("an UNAVAILABLE with data but an unknown reason is the gateway's, not the connection's", () => {
    const e = errorFromStatus(err(status.UNAVAILABLE, "connection limit", { reason: "somethingNew" }));
    assert.ok(e instanceof Overloaded);
    assert.ok(!(e instanceof ConnectionLost));
  });
});
