from calculet.v1 import inference_pb2 as _inference_pb2
from calculet.v1 import observe_pb2 as _observe_pb2
from calculet.v1 import operate_pb2 as _operate_pb2
from calculet.v1 import options_pb2 as _options_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
