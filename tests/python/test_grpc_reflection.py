"""Server reflection as standard tools speak it, with no protos and no
token: Python's grpcio-reflection client (it speaks v1alpha only, like
Postman and older grpcurl) lists the gateway's services and resolves their
descriptors; the same client pointed at the v1 service gets the same."""

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

SERVICES = {
    "exec_gateway.v1.ProcessService",
    "exec_gateway.v1.FileService",
    "exec_gateway.v1.SessionService",
    "exec_gateway.v1.EnvironmentService",
    "grpc.health.v1.Health",
}
V1ALPHA = "/grpc.reflection.v1alpha.ServerReflection/"
V1 = "/grpc.reflection.v1.ServerReflection/"


class _ToV1(grpc.StreamStreamClientInterceptor):
    """Sends grpcio-reflection's v1alpha calls to the v1 service instead:
    v1 is the same protocol, message for message, under a new package, and
    grpcio-reflection ships no v1 client."""

    def intercept_stream_stream(self, continuation, details, requests):
        method = details.method
        if isinstance(method, bytes):
            method = method.decode()
        assert method.startswith(V1ALPHA), method
        # grpc hands interceptors its call details as a namedtuple.
        return continuation(details._replace(method=V1 + method[len(V1ALPHA):]),
                            requests)


def check_reflection(channel):
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    assert SERVICES <= services, services

    # The file that defines ProcessService, straight from the server...
    fd = db.FindFileContainingSymbol("exec_gateway.v1.ProcessService")
    assert fd.name == "exec_gateway/v1/process.proto", fd.name
    assert fd.package == "exec_gateway.v1"
    assert "Exec" in {m.name for s in fd.service for m in s.method}

    # ...and as descriptors a pool builds from it (dependencies included).
    pool = DescriptorPool(db)
    svc = pool.FindServiceByName("exec_gateway.v1.ProcessService")
    methods = {m.name for m in svc.methods}
    assert {"Exec", "Start", "Attach", "Read", "Write", "Terminate"} <= methods, methods
    exec_method = svc.FindMethodByName("Exec")
    assert exec_method.input_type.full_name == "exec_gateway.v1.ExecRequest"
    assert exec_method.output_type.full_name == "exec_gateway.v1.ExecResponse"
    assert exec_method.server_streaming and not exec_method.client_streaming
    spec = exec_method.input_type.fields_by_name["spec"].message_type
    assert spec.full_name == "exec_gateway.v1.ProcessSpec"
    assert {"process_id", "argv", "cwd", "env", "tty"} <= set(spec.fields_by_name)

    read = pool.FindServiceByName("exec_gateway.v1.FileService").FindMethodByName("ReadFile")
    assert read.server_streaming


def test_v1alpha_reflection_lists_and_describes_the_services(gateway):
    with grpc.insecure_channel(gateway.grpc_target) as ch:
        check_reflection(ch)


def test_v1_reflection_lists_and_describes_the_services(gateway):
    with grpc.insecure_channel(gateway.grpc_target) as ch:
        check_reflection(grpc.intercept_channel(ch, _ToV1()))


def test_v1_and_v1alpha_list_the_same_services(gateway):
    with grpc.insecure_channel(gateway.grpc_target) as ch:
        v1alpha = set(ProtoReflectionDescriptorDatabase(ch).get_services())
        v1 = set(ProtoReflectionDescriptorDatabase(
            grpc.intercept_channel(ch, _ToV1())).get_services())
    assert SERVICES <= v1
    assert v1 == v1alpha
