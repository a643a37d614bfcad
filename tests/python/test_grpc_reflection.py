"""Server reflection as standard tools speak it: Python's grpcio-reflection
(v1alpha only, like Postman and older grpcurl) lists the gateway's
services and resolves their descriptors without protos or a token; the
v1 service answers the same request."""

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha import reflection_pb2
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


def test_v1alpha_reflection_lists_and_describes_the_services(gateway):
    with grpc.insecure_channel(gateway.grpc_target) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        services = set(db.get_services())
        assert SERVICES <= services, services
        pool = DescriptorPool(db)
        svc = pool.FindServiceByName("exec_gateway.v1.ProcessService")
        methods = {m.name for m in svc.methods}
        assert {"Exec", "Attach", "Start", "Resize"} <= methods
        exec_method = svc.FindMethodByName("Exec")
        assert exec_method.output_type.full_name == "exec_gateway.v1.ExecResponse"
        assert exec_method.server_streaming


def list_services(ch, service):
    """One ListServices request on reflection service `service` (v1 and
    v1alpha messages are the same on the wire)."""
    call = ch.stream_stream(
        f"/{service}/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    (resp,) = list(call(iter([req]), timeout=20))
    return {s.name for s in resp.list_services_response.service}


def test_v1_and_v1alpha_answer_the_same(gateway):
    with grpc.insecure_channel(gateway.grpc_target) as ch:
        v1 = list_services(ch, "grpc.reflection.v1.ServerReflection")
        v1alpha = list_services(ch, "grpc.reflection.v1alpha.ServerReflection")
    assert SERVICES <= v1
    assert v1 == v1alpha
