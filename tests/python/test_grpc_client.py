"""Cross-language gRPC: a Python grpcio client, with stubs generated from
proto/ at test time, runs a process, attaches, writes stdin, signals, and
reads and writes a file."""

import grpc
import pytest


def meta(gateway, **kw):
    return [("authorization", f"Bearer {gateway.token(**kw)}")]


def test_process_and_files_over_grpc(gateway, stubs, scratch):
    s, p, f = stubs["session"], stubs["process"], stubs["file"]
    with grpc.insecure_channel(gateway.grpc_target) as ch:
        sessions = stubs["session_grpc"].SessionServiceStub(ch)
        procs = stubs["process_grpc"].ProcessServiceStub(ch)
        files = stubs["file_grpc"].FileServiceStub(ch)
        md = meta(gateway)
        sid = sessions.CreateSession(s.CreateSessionRequest(client_name="py"),
                                     metadata=md, timeout=20).session_id

        spec = p.ProcessSpec(
            process_id="py1",
            argv=["sh", "-c", "trap 'echo got-term; exit 3' TERM; read line; echo in:$line; "
                              "while :; do sleep 0.05; done"],
            cwd="/tmp", env={"PATH": "/usr/bin:/bin"}, pipe_stdin=True)
        procs.Start(p.StartRequest(session_id=sid, spec=spec), metadata=md, timeout=20)
        w = procs.Write(p.WriteRequest(session_id=sid, process_id="py1", data=b"hello\n"),
                        metadata=md, timeout=20)
        assert w.status == p.WRITE_STATUS_ACCEPTED

        events = procs.Attach(p.AttachRequest(session_id=sid, process_id="py1", after_seq=0),
                              metadata=md, timeout=20)
        out, code, seqs, signalled = b"", None, [], False
        for msg in events:
            ev = msg.event
            seqs.append(ev.seq)
            kind = ev.WhichOneof("event")
            if kind == "output":
                out += ev.output.data
                if b"in:hello" in out and not signalled:
                    procs.Signal(p.SignalRequest(session_id=sid, process_id="py1",
                                                 signal=p.SIGNAL_KIND_TERMINATE),
                                 metadata=md, timeout=20)
                    signalled = True
            elif kind == "exited":
                code = ev.exited.exit_code
            elif kind == "closed":
                break
        assert b"in:hello\n" in out and b"got-term" in out, out
        assert code == 3
        assert seqs == list(range(1, len(seqs) + 1))

        path = str(scratch / "py.bin")
        blob = bytes(range(256)) * 20000  # 5 MB, several messages
        chunks = [f.WriteFileRequest(path=path, data=blob[:1 << 20])] + [
            f.WriteFileRequest(data=blob[i:i + (1 << 20)])
            for i in range(1 << 20, len(blob), 1 << 20)]
        r = files.WriteFile(iter(chunks), metadata=md, timeout=20)
        assert r.bytes_written == len(blob)
        back = b"".join(m.data for m in files.ReadFile(f.ReadFileRequest(path=path),
                                                       metadata=md, timeout=20))
        assert back == blob

        with pytest.raises(grpc.RpcError) as e:
            files.GetMetadata(f.GetMetadataRequest(path=str(scratch / "missing")),
                              metadata=md, timeout=20)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as e:
            sessions.CreateSession(s.CreateSessionRequest(), timeout=20)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_environment_and_ranged_reads_over_grpc(gateway, stubs, scratch):
    e, f = stubs["environment"], stubs["file"]
    (scratch / "digits").write_bytes(b"0123456789")
    with grpc.insecure_channel(gateway.grpc_target) as ch:
        env = stubs["environment_grpc"].EnvironmentServiceStub(ch)
        files = stubs["file_grpc"].FileServiceStub(ch)
        info = env.GetInfo(e.GetInfoRequest(), metadata=meta(gateway), timeout=20)
        assert info.platform_os == "linux"
        assert info.cwd == "/"  # the fixture's tenants are host-rooted
        assert info.capabilities["fsWatchMissing"] is True
        part = b"".join(m.data for m in files.ReadFile(
            f.ReadFileRequest(path=str(scratch / "digits"), offset=2, length=5),
            metadata=meta(gateway), timeout=20))
        assert part == b"23456"
        with pytest.raises(grpc.RpcError) as err:
            env.GetInfo(e.GetInfoRequest(), timeout=20)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
