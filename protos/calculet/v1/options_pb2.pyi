from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class Plane(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLANE_UNSPECIFIED: _ClassVar[Plane]
    PLANE_INFERENCE: _ClassVar[Plane]
    PLANE_OBSERVE: _ClassVar[Plane]
    PLANE_OPERATE: _ClassVar[Plane]
PLANE_UNSPECIFIED: Plane
PLANE_INFERENCE: Plane
PLANE_OBSERVE: Plane
PLANE_OPERATE: Plane
PLANE_FIELD_NUMBER: _ClassVar[int]
plane: _descriptor.FieldDescriptor
